"""From request records to a warm-up plan (pure): candidates, forecast, budgets, order.

Candidates are the shared prefixes of the records (:mod:`pipeline.shared_prefixes`), the adapters
they used, optionally one representative request per workload shape (for a replica that just
started). A gateway's responses and embeddings come from :mod:`pipeline.planner.gateway` as
the caller's ``extra``.
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import pandas as pd

from pipeline.keys import adapter_key, shape_key, template_head_key
from pipeline.planner.plan import EngineCost, PlanBudget, WarmItem, WarmPlan
from pipeline.planner.reasons import PlanReason, plan_reason
from pipeline.planner.select import build_plan, with_cache_salt
from pipeline.prefix_blocks import DEFAULT_BLOCK_SIZE, count_tokens
from pipeline.shared_prefixes import Detect, detect_prefixes, prefix_items, present

#: Prompt and output length buckets (tokens) that name a workload shape.
PROMPT_BUCKETS = (128, 512, 2048, 8192)
OUTPUT_BUCKETS = (16, 128, 512)


#: A prefix last used more than this many windows before the newest record is not planned.
DEFAULT_RECENT_WINDOWS = 12


@dataclass(frozen=True)
class PlanRequest:
    """Everything a plan is built from besides the records.

    ``reason`` says why the plan is made (:class:`~pipeline.planner.reasons.PlanReason`):
    ``replica`` adds one request per workload shape (a fresh replica runs each once);
    ``template`` plans only the candidates the
    caller passes (the changed templates' new heads, :func:`template_head_items`); the others
    plan what the records suggest. ``recent_windows`` bounds how old a prefix may be.
    ``newest_since`` (Unix seconds, set after a drift trigger) is where the newest windows
    begin: the frequency estimate takes windows before it at a fraction
    (:mod:`pipeline.planner.recency`).
    """

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
    reason: PlanReason = PlanReason.CLI
    recent_windows: int = DEFAULT_RECENT_WINDOWS
    newest_since: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", plan_reason(self.reason))


def _count(value: object) -> int | None:
    """A token count or length from a record: None when missing (None, NA, NaN) or not a
    number; ``12.0`` (a count column read back as floats) is 12."""
    if present(value) is None:
        return None
    try:
        number = float(str(value))
    except ValueError:
        return None
    return int(number) if math.isfinite(number) else None


def _bucket(value: object, edges: tuple[int, ...]) -> int:
    number = _count(value) or 0  # missing: the smallest bucket
    return next((edge for edge in edges if number <= edge), edges[-1] * 4)


def adapter_items(records: pd.DataFrame, model: str | None) -> list[WarmItem]:
    """One candidate per LoRA adapter the records used, hits = its requests."""
    if "adapter" not in records.columns:
        return []
    counts = Counter(name for a in records["adapter"] if (name := present(a)))
    return [
        WarmItem("adapter", adapter_key(name), model or "", adapter=name, predicted_hits=float(n))
        for name, n in counts.items()
    ]


def configured_adapter_items(names: Iterable[str], model: str) -> list[WarmItem]:
    """Candidates for adapters an engine is configured to serve (a fresh replica loads them
    before their first request); one predicted use each."""
    return [
        WarmItem("adapter", adapter_key(name), model, adapter=name, predicted_hits=1.0)
        for name in dict.fromkeys(names)
    ]


def shape_items(records: pd.DataFrame, model: str | None) -> list[WarmItem]:
    """One representative request per workload shape seen, hits = the shape's requests.

    Where the records carry a ``profile`` column (a fitted workload profiler's labels, see
    ``tasks.services.planning.with_profiles``), a shape is a profile and its representative the
    request closest to the profile's centre (lowest ``profile_distance``); otherwise a shape is a
    (prompt length, output length) bucket and its representative the first request seen.
    """
    rows = [r for r in records.to_dict("records") if present(r.get("prompt")) is not None]
    profiled = "profile" in records.columns and any(present(r.get("profile")) for r in rows)
    shapes: dict[str, dict[str, object]] = {}
    counts: Counter[str] = Counter()
    for row in rows:
        o = _bucket(row.get("output_tokens"), OUTPUT_BUCKETS)
        if profiled:
            profile = present(row.get("profile")) or "unprofiled"
        else:
            profile = f"p{_bucket(row.get('prompt_tokens'), PROMPT_BUCKETS)}-o{o}"
        counts[profile] += 1
        best = shapes.get(profile)
        if best is None or _distance(row) < _distance(best):
            shapes[profile] = row
    return [_shape_item(profile, row, model, float(counts[profile]))
            for profile, row in shapes.items()]  # fmt: skip


def _distance(row: Mapping[str, object]) -> float:
    value = row.get("profile_distance")
    return float(str(value)) if present(value) is not None else math.inf


def _shape_item(profile: str, row: Mapping[str, object], model: str | None,
                hits: float) -> WarmItem:  # fmt: skip
    prompt = str(row["prompt"])
    return WarmItem(
        "shape", shape_key(profile), model or present(row.get("model")) or "", text=prompt,
        tokens=_count(row.get("prompt_tokens")) or count_tokens(prompt), profile=profile,
        predicted_hits=hits,
        params={"max_tokens": _bucket(row.get("output_tokens"), OUTPUT_BUCKETS),
                "ignore_eos": True},
    )  # fmt: skip


@dataclass(frozen=True)
class TemplateHead:
    """A prompt template's static head (the text every rendering starts with), its version tag
    (``<template id>@<version>``), how hot it is, and the endpoints its users call."""

    tag: str
    text: str
    hotness: float = 0.0
    endpoints: tuple[str, ...] = ("completions", "chat")
    tenant: str = "default"


def template_head_items(heads: Iterable[TemplateHead], model: str) -> list[WarmItem]:
    """Candidates for template heads (a template change, a fresh replica): per head, one
    completions item (its text) and one chat item (its text as the system message, through the
    engine's chat template, as chat users send it) for each endpoint its users call."""
    items = []
    for head in heads:
        for endpoint in head.endpoints:
            chat = endpoint == "chat"
            items.append(WarmItem(
                "prefix", template_head_key(model, head.tag, head.text, chat=chat,
                                            tenant=head.tenant),
                model, text=None if chat else head.text,
                messages=({"role": "system", "content": head.text},) if chat else None,
                endpoint="chat" if chat else "completions", tenant=head.tenant,
                tokens=count_tokens(head.text), predicted_hits=head.hotness, template=head.tag,
            ))  # fmt: skip
    return items


def _span(records: pd.DataFrame, window_s: int) -> tuple[int, int] | None:
    if "ts" not in records.columns or records["ts"].isna().all():
        return None
    ts = pd.to_datetime(records["ts"], utc=True).dropna()
    return int(ts.min().timestamp() // window_s), int(ts.max().timestamp() // window_s)


def _min_tokens(request: PlanRequest) -> int:
    """Estimated tokens of the shortest prefix the engine can cache: a block and a token."""
    return (request.budget.block_tokens or request.block_size) + 1


def prefix_candidates(
    records: pd.DataFrame,
    request: PlanRequest,
    forecast: Mapping[str, float] | None = None,
    detect: Detect = detect_prefixes,
) -> list[WarmItem]:
    """The records' prefix tree as candidates, those used within ``recent_windows``
    (``detect``: how the prefixes are detected, a detection shared by several plans)."""
    found = detect(
        records, min_count=request.min_count, block_size=request.block_size,
        window_s=request.window_s, min_tokens=_min_tokens(request),
    )  # fmt: skip
    span = _span(records, request.window_s)
    if span is not None:
        oldest = span[1] - request.recent_windows
        found = [p for p in found if not p.windows or max(p.windows) >= oldest]
    newest = None if request.newest_since is None else int(request.newest_since // request.window_s)
    items = prefix_items(found, forecast, request.window_s, span, newest)
    if request.model:
        items = [i for i in items if i.model in (request.model, "unknown")]
        items = [replace(i, model=request.model) for i in items]
    return items


def candidates(
    records: pd.DataFrame,
    request: PlanRequest,
    forecast: Mapping[str, float] | None = None,
    *,
    extra: Sequence[WarmItem] = (),
    detect: Detect = detect_prefixes,
) -> list[WarmItem]:
    """Every warm-up candidate for ``request.reason``, with predicted hits.

    ``extra`` are candidates the caller knows of (template heads, configured adapters, held
    KV chains); they are scored like the rest, and where the records name the same item, the
    one with more predicted hits stays. A ``template`` plan takes only those. ``detect``
    detects the records' prefixes (:class:`~pipeline.shared_prefixes.DetectedOnce`: a
    detection shared by plans made from one frame).
    """
    if request.reason == "template":
        return list(extra)
    items = prefix_candidates(records, request, forecast, detect)
    if request.adapters:
        items += adapter_items(records, request.model)
    if request.shapes or request.reason == "replica":
        items += shape_items(records, request.model)
    return _with_extra(extra, items)


def _with_extra(extra: Sequence[WarmItem], items: list[WarmItem]) -> list[WarmItem]:
    """``extra`` first, then ``items``; one candidate per key (the one with more hits)."""
    chosen: dict[str, WarmItem] = {}
    for item in (*extra, *items):
        kept = chosen.get(item.key)
        if kept is None or item.predicted_hits > kept.predicted_hits:
            chosen[item.key] = item
    return list(chosen.values())


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
    plan = replace(plan, notes=(f"reason: {request.reason}", *plan.notes), reason=request.reason)
    return with_cache_salt(plan, request.isolate_tenants)
