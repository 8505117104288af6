"""From request records to a warm-up plan (pure): candidates, forecast, budgets, order.

Candidates are the shared prefixes of the records (:mod:`pipeline.prefixes`), the adapters
they used, and — for a replica that just started — one representative request per workload
shape. Predicted hits come from a forecast by item key when one is given (a learned model's
next-window predictions) and from the frequency EWMA of each item's windows otherwise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import pandas as pd

from pipeline.plan import EngineCost, PlanBudget, WarmItem, WarmPlan, build_plan, with_cache_salt
from pipeline.prefix import DEFAULT_BLOCK_SIZE
from pipeline.prefixes import detect_prefixes, prefix_items

#: Prompt and output length buckets (tokens) that name a workload shape.
PROMPT_BUCKETS = (128, 512, 2048, 8192)
OUTPUT_BUCKETS = (16, 128, 512)


@dataclass(frozen=True)
class PlanRequest:
    """Everything a plan is built from besides the records."""

    engine: str
    model: str | None = None
    budget: PlanBudget = field(default_factory=PlanBudget)
    cost: EngineCost = field(default_factory=EngineCost)
    weights: Mapping[str, float] = field(default_factory=dict)
    shares: Mapping[str, float] = field(default_factory=dict)
    isolate_tenants: bool = False
    min_count: int = 2
    window_s: int = 300
    block_size: int = DEFAULT_BLOCK_SIZE
    adapters: bool = True
    shapes: bool = False


def _bucket(value: object, edges: tuple[int, ...]) -> int:
    try:
        number = int(str(value))
    except ValueError:  # missing (NA, None, NaN): the smallest bucket
        number = 0
    return next((edge for edge in edges if number <= edge), edges[-1] * 4)


def adapter_items(records: pd.DataFrame, model: str | None) -> list[WarmItem]:
    """One candidate per LoRA adapter the records used, hits = its requests."""
    if "adapter" not in records.columns:
        return []
    counts = Counter(str(a) for a in records["adapter"].dropna() if str(a))
    return [
        WarmItem("adapter", f"adapter:{name}", model or "", adapter=name, predicted_hits=float(n))
        for name, n in counts.items()
    ]


def shape_items(records: pd.DataFrame, model: str | None) -> list[WarmItem]:
    """One representative request per (prompt length, output length) shape seen."""
    shapes: dict[str, WarmItem] = {}
    counts: Counter[str] = Counter()
    for row in records.to_dict("records"):
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            continue
        p = _bucket(row.get("prompt_tokens"), PROMPT_BUCKETS)
        o = _bucket(row.get("output_tokens"), OUTPUT_BUCKETS)
        profile = f"p{p}-o{o}"
        counts[profile] += 1
        shapes.setdefault(profile, WarmItem(
            "shape", f"shape:{profile}", model or str(row.get("model") or ""), text=prompt,
            tokens=int(row.get("prompt_tokens") or 0), profile=profile,
            params={"max_tokens": o, "ignore_eos": True},
        ))  # fmt: skip
    return [replace(item, predicted_hits=float(counts[k])) for k, item in shapes.items()]


def candidates(
    records: pd.DataFrame, request: PlanRequest, forecast: Mapping[str, float] | None = None
) -> list[WarmItem]:
    """Every warm-up candidate the records suggest, with predicted hits."""
    found = detect_prefixes(
        records, min_count=request.min_count, block_size=request.block_size,
        window_s=request.window_s,
    )  # fmt: skip
    items = prefix_items(found, forecast, request.window_s)
    if request.model:
        items = [i for i in items if i.model in (request.model, "unknown")]
        items = [replace(i, model=request.model) for i in items]
    if request.adapters:
        items += adapter_items(records, request.model)
    if request.shapes:
        items += shape_items(records, request.model)
    return items


def plan_from_records(
    records: pd.DataFrame,
    request: PlanRequest,
    forecast: Mapping[str, float] | None = None,
    plan_id: str | None = None,
) -> WarmPlan:
    """A budgeted, ordered plan for ``request.engine`` from served-request records."""
    items = candidates(records, request, forecast)
    plan = build_plan(
        request.engine, items, request.budget, request.cost, request.weights, request.shares,
        plan_id,
    )  # fmt: skip
    return with_cache_salt(plan, request.isolate_tenants)
