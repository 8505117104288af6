"""Warm-up plans (pure): items, budgets, scores, selection and priming order.

An item's score is the engine time it saves in the next window, in seconds::

    score = predicted_hits × (uncached prompt tokens × prefill s/token) × tenant weight
            − warm_cost_weight × warm cost (its own prefill + a fixed per-request overhead)

The warm cost is paid by the engine off the users' critical path (before traffic arrives), so it
weighs far less than a user's wait (``warm_cost_weight`` well below 1): an item with expected
hits is worth warming when there is room; the cost breaks ties, and the wall-time budget
(charged the full warm cost) binds when warming time is short.

Selection takes items by score under the budgets (item count, tokens = the engine's cache
capacity, wall time at the engine's concurrency), gives every tenant at most its share of the
count and token budgets, and keeps at least one representative of every workload profile.

Order matters when the cache is smaller than the working set: an engine's LRU keeps what was
primed *last*, so the plan primes the least valuable first and the most valuable (soonest
needed) last. ``WarmPlan.items`` is in priming order.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pipeline.errors import BadInputError

ITEM_KINDS = ("prefix", "response", "embedding", "adapter", "shape")
#: Request fields an item may carry; model, prompt and URL are never taken from a plan.
ITEM_PARAMS = frozenset({
    "cache_salt", "add_special_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
    "ignore_eos", "max_tokens", "min_tokens", "presence_penalty", "frequency_penalty",
    "repetition_penalty",
})  # fmt: skip
ENDPOINTS = ("completions", "chat")
#: Prefill cost assumed when an engine's was never measured (a small model on CPU: ~1 ms/token).
DEFAULT_PREFILL_S_PER_TOKEN = 1e-3
#: Fixed cost of one warm-up request (HTTP, scheduling, one decode step).
DEFAULT_REQUEST_OVERHEAD_S = 0.01
#: What the first request to an unloaded LoRA adapter waits for its load.
DEFAULT_ADAPTER_LOAD_S = 0.5
#: Decode cost per output token when never measured (a small model on CPU).
DEFAULT_DECODE_S_PER_TOKEN = 0.02
#: Weight of an engine second spent warming against a second a user waits (off the hot path).
DEFAULT_WARM_COST_WEIGHT = 0.05


@dataclass(frozen=True, slots=True)
class WarmItem:
    """One thing to warm. ``key`` is its stable identity (a cache key or a prefix hash).

    ``text`` or ``messages`` is the prompt (messages go through ``/v1/chat/completions`` so the
    engine's chat template renders them); ``params`` are extra request fields (sampling
    parameters for a response, ``max_tokens`` for a shape, ``add_special_tokens``...).
    ``next_use_s`` is the expected delay until first use, when a forecast knows it.
    """

    kind: str
    key: str
    model: str
    text: str | None = None
    messages: tuple[Mapping[str, str], ...] | None = None
    endpoint: str = "completions"
    tenant: str = "default"
    tokens: int = 0
    predicted_hits: float = 0.0
    score: float = 0.0
    profile: str | None = None
    adapter: str | None = None
    template: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    next_use_s: float | None = None
    token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ITEM_KINDS:
            raise BadInputError(f"unknown kind {self.kind!r}", where=f"item {self.key}.kind")
        if self.endpoint not in ENDPOINTS:
            raise BadInputError(f"unknown endpoint {self.endpoint!r}", where=f"item {self.key}")
        if self.kind != "adapter" and self.text is None and self.messages is None:
            raise BadInputError("needs text or messages", where=f"item {self.key}")
        unknown = set(self.params) - ITEM_PARAMS
        if unknown:
            raise BadInputError(
                f"unknown request fields {sorted(unknown)}", where=f"item {self.key}"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        data = asdict(self)
        data["messages"] = [dict(m) for m in self.messages] if self.messages else None
        data["params"] = dict(self.params)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "item") -> WarmItem:
        """Inverse of :meth:`to_dict`; unknown or missing fields are bad input naming ``where``."""
        known = set(cls.__dataclass_fields__)
        extra = set(data) - known
        if extra:
            raise BadInputError(f"unknown fields {sorted(extra)}", where=where)
        values = dict(data)
        if values.get("messages") is not None:
            values["messages"] = tuple(dict(m) for m in values["messages"])
        if values.get("token_ids") is not None:
            values["token_ids"] = tuple(values["token_ids"])
        try:
            return cls(**values)
        except TypeError as exc:
            raise BadInputError(str(exc), where=where) from exc


@dataclass(frozen=True, slots=True)
class PlanBudget:
    """Limits of one plan. ``max_tokens`` is the engine's cache capacity (None = unbounded).

    With ``block_tokens`` (the engine's KV-cache block size) an item takes whole blocks of that
    capacity: its prompt and the one token its priming request generates, rounded up.
    """

    max_items: int = 100
    max_tokens: int | None = None
    max_seconds: float = 60.0
    concurrency: int = 4
    batch_size: int = 16
    block_tokens: int | None = None

    def cache_tokens(self, item: WarmItem) -> int:
        """The share of the cache's capacity ``item`` takes once primed."""
        if not self.block_tokens or item.tokens <= 0:
            return item.tokens
        return math.ceil((item.tokens + 1) / self.block_tokens) * self.block_tokens


@dataclass(frozen=True, slots=True)
class EngineCost:
    """What warming costs on one engine and what a cached token saves."""

    prefill_s_per_token: float = DEFAULT_PREFILL_S_PER_TOKEN
    request_overhead_s: float = DEFAULT_REQUEST_OVERHEAD_S
    adapter_load_s: float = DEFAULT_ADAPTER_LOAD_S
    decode_s_per_token: float = DEFAULT_DECODE_S_PER_TOKEN
    warm_cost_weight: float = DEFAULT_WARM_COST_WEIGHT


@dataclass(frozen=True, slots=True)
class WarmPlan:
    """A budgeted list of items in priming order, for one engine."""

    plan_id: str
    engine: str
    items: tuple[WarmItem, ...]
    budget: PlanBudget = PlanBudget()
    dropped: int = 0
    notes: tuple[str, ...] = ()

    def batches(self, size: int | None = None) -> list[tuple[WarmItem, ...]]:
        """The items cut into batches of ``size`` (default: the budget's), order kept."""
        step = size or self.budget.batch_size
        return [self.items[i : i + step] for i in range(0, len(self.items), step)]

    @property
    def tokens(self) -> int:
        """Total prompt tokens the plan puts into the engine."""
        return sum(item.tokens for item in self.items)

    def to_json(self) -> str:
        """JSON text of the whole plan (what ``--out plan.json`` and the Redis store hold)."""
        data = {
            "plan_id": self.plan_id,
            "engine": self.engine,
            "budget": asdict(self.budget),
            "dropped": self.dropped,
            "notes": list(self.notes),
            "items": [item.to_dict() for item in self.items],
        }
        return json.dumps(data, ensure_ascii=False, indent=1)

    @classmethod
    def from_json(cls, raw: str | bytes, where: str = "plan") -> WarmPlan:
        """Parse :meth:`to_json` output; malformed plans are bad input naming the item."""
        try:
            data = json.loads(raw)
            items = tuple(
                WarmItem.from_dict(item, where=f"{where}: items[{i}]")
                for i, item in enumerate(data["items"])
            )
            return cls(
                plan_id=str(data["plan_id"]),
                engine=str(data["engine"]),
                items=items,
                budget=PlanBudget(**data.get("budget", {})),
                dropped=int(data.get("dropped", 0)),
                notes=tuple(data.get("notes", ())),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInputError(f"not a warm plan ({exc})", where=where) from exc


def new_plan_id() -> str:
    """A fresh plan id (safe inside Redis keys)."""
    return uuid.uuid4().hex[:16]


def warm_cost_s(item: WarmItem, cost: EngineCost) -> float:
    """Engine seconds one warm-up request for ``item`` takes."""
    return item.tokens * cost.prefill_s_per_token + cost.request_overhead_s


def score_item(item: WarmItem, cost: EngineCost, weight: float = 1.0) -> float:
    """Seconds ``item`` saves in the next window minus the weighted cost of warming it.

    An adapter saves its load time once (on the first request), not per hit.
    """
    if item.kind == "adapter":
        saved = cost.adapter_load_s if item.predicted_hits > 0 else 0.0
        return saved * weight - cost.warm_cost_weight * cost.request_overhead_s
    saved_per_hit = item.tokens * cost.prefill_s_per_token
    if item.kind == "response":  # a cached answer saves the decode too
        saved_per_hit += int(item.params.get("max_tokens", 16)) * cost.decode_s_per_token
    return item.predicted_hits * saved_per_hit * weight - cost.warm_cost_weight * warm_cost_s(
        item, cost
    )


@dataclass
class _Tally:
    """Running totals while selecting, overall and per tenant."""

    items: int = 0
    tokens: int = 0
    seconds: float = 0.0
    per_tenant_items: dict[str, int] = field(default_factory=dict)
    per_tenant_tokens: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Limits:
    budget: PlanBudget
    shares: Mapping[str, float]
    cost: EngineCost

    def fits(self, item: WarmItem, tally: _Tally) -> bool:
        b, share = self.budget, self.shares.get(item.tenant, 1.0)
        seconds = tally.seconds + warm_cost_s(item, self.cost) / max(1, b.concurrency)
        if tally.items + 1 > b.max_items or seconds > b.max_seconds:
            return False
        if tally.per_tenant_items.get(item.tenant, 0) + 1 > math.ceil(b.max_items * share):
            return False
        if b.max_tokens is None:
            return True
        tokens = b.cache_tokens(item)
        tenant_tokens = tally.per_tenant_tokens.get(item.tenant, 0) + tokens
        return tally.tokens + tokens <= b.max_tokens and tenant_tokens <= b.max_tokens * share


def _take(item: WarmItem, tally: _Tally, cost: EngineCost, budget: PlanBudget) -> None:
    tokens = budget.cache_tokens(item)
    tally.items += 1
    tally.tokens += tokens
    tally.seconds += warm_cost_s(item, cost) / max(1, budget.concurrency)
    tally.per_tenant_items[item.tenant] = tally.per_tenant_items.get(item.tenant, 0) + 1
    tally.per_tenant_tokens[item.tenant] = tally.per_tenant_tokens.get(item.tenant, 0) + tokens


def priming_order(items: Iterable[WarmItem]) -> list[WarmItem]:
    """Least valuable first, most valuable (or soonest needed) last — an LRU keeps the last.

    Items with a known ``next_use_s`` go by it (latest-needed first); the rest by score.
    """

    def rank(item: WarmItem) -> tuple[float, float, str]:
        soon = -item.next_use_s if item.next_use_s is not None else -math.inf
        return (soon, item.score, item.key)

    return sorted(items, key=rank)


def select_items(
    candidates: Sequence[WarmItem],
    budget: PlanBudget,
    cost: EngineCost = EngineCost(),
    weights: Mapping[str, float] | None = None,
    shares: Mapping[str, float] | None = None,
) -> tuple[list[WarmItem], int]:
    """Score ``candidates``, pick what fits the budgets; return (items in priming order, dropped).

    Profile representatives are taken first (the best-scoring item of each profile, even when
    its score is negative); then the rest while the score is positive and the item fits. Under a
    token budget the cache is a knapsack, so the rest go by score per token (the greedy that
    saves the most seconds per token of cache); otherwise by score.
    """
    weights, limits = weights or {}, _Limits(budget, shares or {}, cost)
    scored = [replace(c, score=score_item(c, cost, weights.get(c.tenant, 1.0))) for c in candidates]
    scored.sort(key=lambda i: (-i.score, i.key))
    if budget.max_tokens is not None:
        scored.sort(key=lambda i: -i.score / max(1, budget.cache_tokens(i)))  # ties: score order
    chosen: dict[str, WarmItem] = {}
    tally = _Tally()
    for item in _representatives(scored) + scored:
        if item.key in chosen or (item.score <= 0 and item.profile is None):
            continue
        if item.score <= 0 and any(c.profile == item.profile for c in chosen.values()):
            continue
        if limits.fits(item, tally):
            chosen[item.key] = item
            _take(item, tally, cost, budget)
    return priming_order(chosen.values()), len(candidates) - len(chosen)


def _representatives(scored: Sequence[WarmItem]) -> list[WarmItem]:
    """The best item of each workload profile (``scored`` is sorted best first)."""
    best: dict[str, WarmItem] = {}
    for item in scored:
        if item.profile is not None:
            best.setdefault(item.profile, item)
    return list(best.values())


def build_plan(
    engine: str,
    candidates: Sequence[WarmItem],
    budget: PlanBudget,
    cost: EngineCost = EngineCost(),
    weights: Mapping[str, float] | None = None,
    shares: Mapping[str, float] | None = None,
    plan_id: str | None = None,
) -> WarmPlan:
    """A :class:`WarmPlan` for ``engine`` from scored candidates under ``budget``."""
    items, dropped = select_items(candidates, budget, cost, weights, shares)
    notes = (f"{len(items)} of {len(candidates)} candidates, {sum(i.tokens for i in items)} tok",)
    return WarmPlan(plan_id or new_plan_id(), engine, tuple(items), budget, dropped, notes)


def with_cache_salt(plan: WarmPlan, isolate_tenants: bool) -> WarmPlan:
    """Give every item of a tenant-isolated engine vLLM's ``cache_salt`` (its tenant name).

    With a salt, one tenant's cached blocks can never be hit by another tenant's prompt.
    """
    if not isolate_tenants:
        return plan
    items = tuple(
        replace(item, params={**item.params, "cache_salt": item.tenant})
        if item.kind in ("prefix", "response", "shape")
        else item
        for item in plan.items
    )
    return replace(plan, items=items)
