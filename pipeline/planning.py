"""From request records to a warm-up plan (pure): candidates, forecast, budgets, order.

Candidates are the shared prefixes of the records (:mod:`pipeline.prefixes`), the adapters
they used, optionally one representative request per workload shape (for a replica that just
started), and the answers and embeddings of prompts asked repeatedly with greedy sampling.
Predicted hits come from a forecast by item key when one is given (a learned model's
next-window predictions) and from the frequency estimate of each item's windows otherwise.

Token counts: the detector counts pseudo-tokens, which differ from an engine's real tokens
(about 0.63 of them for a BPE model on English text), so a token budget in the engine's units
would overfill. Counts measured by the engine's tokenizer come in as data
(``token_counts``: item key → real tokens); unmeasured items are scaled by the measured ratio.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import pandas as pd

from pipeline.keys import response_key
from pipeline.plan import EngineCost, PlanBudget, WarmItem, WarmPlan, build_plan, with_cache_salt
from pipeline.prefix import DEFAULT_BLOCK_SIZE, count_tokens
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
    responses: bool = False
    embeddings: bool = False


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


def _max_tokens(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:  # not logged: vLLM's completions default
        return 16


def _deterministic(row: Mapping[str, object]) -> bool:
    temperature = row.get("temperature")
    try:
        return float(str(temperature)) == 0.0
    except ValueError:  # unknown sampling: not safe to cache its answer
        return False


def response_items(
    records: pd.DataFrame, model: str | None, min_count: int = 2, kind: str = "response"
) -> list[WarmItem]:
    """Prompts asked at least ``min_count`` times with greedy sampling: their answers (or, with
    ``kind='embedding'``, their embeddings) can be cached under a versioned key. The key's
    parameters are ``{"temperature": 0.0, "max_tokens": <as requested>}``, so a client asking
    the same way finds the entry (:func:`pipeline.keys.response_key`)."""
    counts: Counter[tuple[str, str, str, int]] = Counter()
    for row in records.to_dict("records"):
        prompt = row.get("prompt")
        if isinstance(prompt, str) and prompt and _deterministic(row):
            template = str(row.get("template") or "none")
            tenant = str(row.get("tenant") or "default")
            counts[(prompt, template, tenant, _max_tokens(row.get("max_tokens")))] += 1
    items = []
    for (prompt, template, tenant, max_tokens), n in counts.items():
        if n < min_count:
            continue
        params = {"temperature": 0.0, "max_tokens": max_tokens}
        key = response_key(model=model or "unknown", template=template, params=params,
                           text=prompt, tenant=tenant, kind=kind).render()  # fmt: skip
        items.append(WarmItem(kind, key, model or "unknown", text=prompt, tenant=tenant,
                              tokens=count_tokens(prompt), predicted_hits=float(n),
                              template=template, params=params))  # fmt: skip
    return items


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
    if request.responses:
        items += response_items(records, request.model, request.min_count)
    if request.embeddings:
        items += response_items(records, request.model, request.min_count, kind="embedding")
    return items


def token_ratio(items: list[WarmItem], token_counts: Mapping[str, int]) -> float | None:
    """Measured real tokens per estimated token over the measured items (None: none measured)."""
    estimated = sum(i.tokens for i in items if i.key in token_counts and i.tokens > 0)
    measured = sum(token_counts[i.key] for i in items if i.key in token_counts and i.tokens > 0)
    return measured / estimated if estimated and measured else None


def with_token_counts(items: list[WarmItem], token_counts: Mapping[str, int]) -> list[WarmItem]:
    """Items with the engine's measured token counts; unmeasured ones scaled by the ratio seen.

    Adapters carry no prompt and keep their 0 tokens.
    """
    if not token_counts:
        return items
    ratio = token_ratio(items, token_counts)
    out = []
    for item in items:
        if item.key in token_counts:
            out.append(replace(item, tokens=int(token_counts[item.key])))
        elif ratio is not None and item.tokens > 0:
            out.append(replace(item, tokens=max(1, math.ceil(item.tokens * ratio))))
        else:
            out.append(item)
    return out


def plan_from_records(
    records: pd.DataFrame,
    request: PlanRequest,
    forecast: Mapping[str, float] | None = None,
    plan_id: str | None = None,
    token_counts: Mapping[str, int] | None = None,
) -> WarmPlan:
    """A budgeted, ordered plan for ``request.engine`` from served-request records."""
    return plan_from_candidates(
        candidates(records, request, forecast), request, plan_id, token_counts
    )


def plan_from_candidates(
    items: list[WarmItem],
    request: PlanRequest,
    plan_id: str | None = None,
    token_counts: Mapping[str, int] | None = None,
) -> WarmPlan:
    """A budgeted, ordered plan from :func:`candidates`, in the engine's tokens where measured."""
    items = with_token_counts(items, token_counts or {})
    plan = build_plan(
        request.engine, items, request.budget, request.cost, request.weights, request.shares,
        plan_id,
    )  # fmt: skip
    return with_cache_salt(plan, request.isolate_tenants)
