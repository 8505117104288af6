"""Warm-up plans (pure data): items, budgets, engine costs, the plan and its JSON.

How candidates are scored, selected under the budgets and ordered for priming is
:mod:`pipeline.planner.select`; where candidates come from is :mod:`pipeline.planner.candidates`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.errors import BadInputError
from pipeline.planner.reasons import PlanReason, plan_reason

ITEM_KINDS = ("prefix", "response", "embedding", "adapter", "shape", "intent")
#: Request fields an item may carry; model, prompt and URL are never taken from a plan.
ITEM_PARAMS = frozenset({
    "cache_salt", "add_special_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
    "ignore_eos", "max_tokens", "min_tokens", "presence_penalty", "frequency_penalty",
    "repetition_penalty",
})  # fmt: skip
ENDPOINTS = ("completions", "chat", "embeddings")
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
    ``parent`` is the key of the shorter prefix this one extends (priming it warms the parent's
    blocks too), when it has one. ``gateway`` names the gateway (``[[gateways]]``) whose cache
    holds a response or embedding item, and ``request`` is the request its clients send it,
    sent again as it is (the gateway keys its cache on it). An ``intent`` is a frequent
    meaning of a semantic gateway's requests, warmed with one representative ``request``.
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
    parent: str | None = None
    gateway: str | None = None
    request: Mapping[str, Any] | None = None
    #: an ``intent`` item's probes: other intents' logged requests, sent after it is warmed,
    #: which its entry must not answer
    probes: tuple[Mapping[str, Any], ...] | None = None

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
        data["request"] = dict(self.request) if self.request is not None else None
        data["probes"] = [dict(p) for p in self.probes] if self.probes is not None else None
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
        if values.get("probes") is not None:
            values["probes"] = tuple(dict(p) for p in values["probes"])
        try:
            return cls(**values)
        except TypeError as exc:
            raise BadInputError(str(exc), where=where) from exc


@dataclass(frozen=True, slots=True)
class PlanBudget:
    """Limits of one plan. ``max_tokens`` is the engine's cache capacity (None = unbounded).

    With ``block_tokens`` (the engine's KV-cache block size) an item keeps the whole blocks of
    its prompt in that capacity: its partial last block and the block of the token its priming
    request generates hold nothing cached, and vLLM frees them to the front of its free queue,
    to be reused by the next request (``BlockPool.free_blocks``), so they are one block in
    flight for the whole plan, not one per item.
    """

    max_items: int = 100
    max_tokens: int | None = None
    max_seconds: float = 60.0
    concurrency: int = 4
    batch_size: int = 16
    block_tokens: int | None = None

    def cache_tokens(self, item: WarmItem) -> int:
        """The share of the cache's capacity ``item`` keeps once primed: its whole blocks."""
        if item.gateway is not None:  # held in the gateway's store, not the engine's cache
            return 0
        if not self.block_tokens or item.tokens <= 0:
            return item.tokens
        return item.tokens // self.block_tokens * self.block_tokens

    @property
    def in_flight_tokens(self) -> int:
        """Capacity a priming request needs beyond what it keeps: its partial last block and
        its output token's (one block)."""
        return self.block_tokens or 0

    def cached_tokens(self, item: WarmItem) -> int:
        """Tokens of ``item`` a later request can find cached: whole blocks only, and never
        the prompt's last token (an engine always computes at least one), as vLLM does. A
        gateway's entry answers the whole request: every token."""
        if item.gateway is not None or not self.block_tokens or item.tokens <= 0:
            return item.tokens
        return (item.tokens - 1) // self.block_tokens * self.block_tokens

    def cacheable(self, item: WarmItem) -> bool:
        """False for a prefix the engine cannot cache (shorter than one block plus a token)."""
        return item.kind != "prefix" or self.cached_tokens(item) > 0


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
    reason: PlanReason = PlanReason.CLI
    #: the fleet road its prefixes take when not their policy's ("": the policy's own; see
    #: :func:`pipeline.fleet_roads.through_router`)
    road: str = ""

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
            "reason": self.reason.value,
            "items": [item.to_dict() for item in self.items],
        }
        if self.road:
            data["road"] = self.road
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
                reason=plan_reason(str(data.get("reason", PlanReason.CLI)), where=where),
                road=str(data.get("road", "")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInputError(f"not a warm plan ({exc})", where=where) from exc


def new_plan_id() -> str:
    """A fresh plan id (safe inside Redis keys)."""
    return uuid.uuid4().hex[:16]


def warm_cost_s(item: WarmItem, cost: EngineCost) -> float:
    """Engine seconds one warm-up request for ``item`` takes."""
    return item.tokens * cost.prefill_s_per_token + cost.request_overhead_s
