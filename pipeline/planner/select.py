"""Scoring, selection under the budgets, and priming order of warm-up candidates (pure).

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

import heapq
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from pipeline.planner.plan import (
    EngineCost,
    PlanBudget,
    WarmItem,
    WarmPlan,
    new_plan_id,
    warm_cost_s,
)

#: Costs assumed when a caller gives none (the defaults of :class:`EngineCost`).
DEFAULT_COST = EngineCost()


def score_item(
    item: WarmItem, cost: EngineCost, weight: float = 1.0, budget: PlanBudget | None = None
) -> float:
    """Seconds ``item`` saves in the next window minus the weighted cost of warming it.

    A prefix saves the prefill of what a later request finds cached (with ``budget``'s block
    size: whole blocks, never the last token). An adapter saves its load time once (on the
    first request), not per hit.
    """
    if item.kind == "adapter":
        saved = cost.adapter_load_s if item.predicted_hits > 0 else 0.0
        return saved * weight - cost.warm_cost_weight * cost.request_overhead_s
    cached = budget.cached_tokens(item) if budget is not None else item.tokens
    saved_per_hit = cached * cost.prefill_s_per_token
    if item.kind in ("response", "intent"):  # a cached answer saves the decode too
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

    def add(self, charge: _Charge, sign: int = 1) -> None:
        """Count an item's ``charge`` in (``sign`` 1) or out (-1)."""
        tokens = sign * charge.tokens
        self.items += sign
        self.tokens += tokens
        self.seconds += sign * charge.seconds
        self.per_tenant_items[charge.tenant] = self.per_tenant_items.get(charge.tenant, 0) + sign
        self.per_tenant_tokens[charge.tenant] = (
            self.per_tenant_tokens.get(charge.tenant, 0) + tokens
        )


@dataclass(frozen=True, slots=True)
class _Charge:
    """What one chosen item costs the budgets: cache tokens beyond the blocks already warm
    (an ancestor's, kept by another item of the chain), and wall seconds at the concurrency."""

    tenant: str
    tokens: int
    seconds: float


@dataclass(frozen=True, slots=True)
class _Limits:
    budget: PlanBudget
    shares: Mapping[str, float]
    cost: EngineCost

    def charge(self, item: WarmItem, base: WarmItem | None, based: _Charge | None) -> _Charge:
        """``item``'s charge when ``base`` (its nearest ancestor already warm, whose own charge
        is ``based`` if it is chosen and replaced now) keeps blocks it shares."""
        b = self.budget
        seconds = warm_cost_s(item, self.cost) / max(1, b.concurrency)
        if base is None:
            return _Charge(item.tenant, b.cache_tokens(item), seconds)
        extra = max(0, b.cache_tokens(item) - b.cache_tokens(base))
        return _Charge(item.tenant, extra + (based.tokens if based else 0), seconds)

    def fits(self, charge: _Charge, tally: _Tally, replaces: _Charge | None = None) -> bool:
        """Whether ``charge`` fits, in place of ``replaces`` (its ancestor's) when given."""
        trial = replace(tally, per_tenant_items=dict(tally.per_tenant_items),
                        per_tenant_tokens=dict(tally.per_tenant_tokens))  # fmt: skip
        if replaces is not None:
            trial.add(replaces, sign=-1)
        trial.add(charge)
        tenant = charge.tenant
        b, share = self.budget, self.shares.get(tenant, 1.0)
        if trial.items > b.max_items or trial.seconds > b.max_seconds:
            return False
        if trial.per_tenant_items.get(tenant, 0) > math.ceil(b.max_items * share):
            return False
        if b.max_tokens is None:
            return True
        tenant_tokens = trial.per_tenant_tokens.get(tenant, 0)
        room = b.max_tokens - b.in_flight_tokens
        return trial.tokens <= room and tenant_tokens <= room * share


def priming_order(items: Iterable[WarmItem]) -> list[WarmItem]:
    """Adapters first (they hold no cache, and a prefix primed through an adapter needs it
    loaded); then least valuable first, most valuable (or soonest needed) last — an LRU keeps
    the last.

    Items with a known ``next_use_s`` go by it (latest-needed first); the rest by score.
    """

    def rank(item: WarmItem) -> tuple[bool, float, float, str]:
        soon = -item.next_use_s if item.next_use_s is not None else -math.inf
        return (item.kind != "adapter", soon, item.score, item.key)

    return sorted(items, key=rank)


@dataclass(frozen=True, slots=True)
class Selection:
    """What :func:`select_items` chose: items in priming order and what it left out."""

    items: list[WarmItem]
    dropped: int
    uncacheable: int = 0
    credited: int = 0


class _Tree:
    """Scored candidates as a forest of prefix chains (``WarmItem.parent``)."""

    def __init__(self, scored: Sequence[WarmItem], budget: PlanBudget, cost: EngineCost,
                 weights: Mapping[str, float]) -> None:  # fmt: skip
        self.by_key = {item.key: item for item in scored}
        self.budget, self.cost, self.weights = budget, cost, weights
        self.children: dict[str, list[WarmItem]] = {}
        for item in scored:
            if self.parent(item) is not None:
                self.children.setdefault(str(item.parent), []).append(item)

    def parent(self, item: WarmItem) -> WarmItem | None:
        return self.by_key.get(item.parent) if item.parent is not None else None

    def ancestors(self, item: WarmItem) -> list[WarmItem]:
        out, node = [], self.parent(item)
        while node is not None and node not in out:
            out.append(node)
            node = self.parent(node)
        return out

    def gain(self, item: WarmItem) -> tuple[float, int]:
        """Seconds saved and cache tokens added by priming ``item`` instead of its parent."""
        parent = self.parent(item)
        if parent is None:
            return item.score, self.budget.cache_tokens(item)
        b, c = self.budget, self.cost
        extra = max(0, b.cached_tokens(item) - b.cached_tokens(parent))
        saved = item.predicted_hits * extra * c.prefill_s_per_token
        warm = max(0, item.tokens - parent.tokens) * c.prefill_s_per_token
        gain = saved * self.weights.get(item.tenant, 1.0) - c.warm_cost_weight * warm
        return gain, b.cache_tokens(item) - b.cache_tokens(parent)


def select_items(
    candidates: Sequence[WarmItem],
    budget: PlanBudget,
    cost: EngineCost = DEFAULT_COST,
    weights: Mapping[str, float] | None = None,
    shares: Mapping[str, float] | None = None,
) -> Selection:
    """Score ``candidates``, pick what fits the budgets; items in priming order.

    Prefixes the engine cannot cache are never taken. Nested prefixes are one chain: a longer
    prefix becomes a candidate once its parent is taken, and taking it *replaces* the parent
    (its priming warms the parent's blocks), for what it adds: its own hits on the blocks
    beyond the parent's, at the cache tokens beyond the parent's. Profile representatives are
    taken first (the best-scoring item of each profile, even when its score is negative); then
    the rest while their gain is positive and they fit. Under a token budget the cache is a
    knapsack, so candidates go by gain per cache token (the greedy that saves the most seconds
    per token of cache); otherwise by gain.
    """
    weights, limits = weights or {}, _Limits(budget, shares or {}, cost)
    cacheable = [c for c in candidates if budget.cacheable(c)]
    scored = [replace(c, score=score_item(c, cost, weights.get(c.tenant, 1.0), budget))
              for c in cacheable]  # fmt: skip
    scored.sort(key=lambda i: (-i.score, i.key))
    tree = _Tree(scored, budget, cost, weights)
    chosen: dict[str, WarmItem] = {}
    charges: dict[str, _Charge] = {}
    covered: set[str] = set()
    tally, credited = _Tally(), 0
    order = itertools.count()  # ties go first come, first served (never compare items)
    queue = [(-math.inf, next(order), item) for item in _representatives(scored)]
    queue += [_entry(tree, item, next(order), budget) for item in scored
              if tree.parent(item) is None]  # fmt: skip
    heapq.heapify(queue)
    while queue:
        priority, _, item = heapq.heappop(queue)
        if item.key in chosen or item.key in covered:
            continue
        gain, _tokens = tree.gain(item)
        representative = priority == -math.inf and not any(
            c.profile == item.profile for c in chosen.values()
        )
        if gain <= 0 and not representative:
            continue
        base = next((a for a in tree.ancestors(item) if a.key in chosen or a.key in covered), None)
        ancestor = base if base is not None and base.key in chosen else None
        replaced = charges.get(ancestor.key) if ancestor is not None else None
        charge = limits.charge(item, base, replaced)
        if not limits.fits(charge, tally, replaced):
            continue
        if ancestor is not None and replaced is not None:
            tally.add(charges.pop(ancestor.key), sign=-1)
            item = _merged(item, chosen.pop(ancestor.key), gain)
            credited += 1
        covered.update(a.key for a in tree.ancestors(item))
        chosen[item.key], charges[item.key] = item, charge
        tally.add(charge)
        for child in tree.children.get(item.key, ()):
            heapq.heappush(queue, _entry(tree, child, next(order), budget))
    return Selection(priming_order(chosen.values()), len(candidates) - len(chosen),
                     len(candidates) - len(cacheable), credited)  # fmt: skip


def _entry(
    tree: _Tree, item: WarmItem, order: int, budget: PlanBudget
) -> tuple[float, int, WarmItem]:
    gain, tokens = tree.gain(item)
    priority = gain / max(1, tokens) if budget.max_tokens is not None else gain
    return (-priority, order, item)


def _merged(item: WarmItem, ancestor: WarmItem, gain: float) -> WarmItem:
    """``item`` in its ancestor's place: the ancestor's hits and value credited to it."""
    uses = [u for u in (item.next_use_s, ancestor.next_use_s) if u is not None]
    return replace(item, predicted_hits=max(item.predicted_hits, ancestor.predicted_hits),
                   score=ancestor.score + gain, next_use_s=min(uses) if uses else None,
                   profile=item.profile or ancestor.profile)  # fmt: skip


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
    cost: EngineCost = DEFAULT_COST,
    weights: Mapping[str, float] | None = None,
    shares: Mapping[str, float] | None = None,
    plan_id: str | None = None,
) -> WarmPlan:
    """A :class:`WarmPlan` for ``engine`` from scored candidates under ``budget``."""
    chosen = select_items(candidates, budget, cost, weights, shares)
    items = chosen.items
    notes = (
        f"{len(items)} of {len(candidates)} candidates, {sum(i.tokens for i in items)} tok",
        f"prefix chains: {chosen.credited} shorter prefixes credited to a longer one",
        f"uncacheable: {chosen.uncacheable} prefixes shorter than one cache block",
    )
    return WarmPlan(plan_id or new_plan_id(), engine, tuple(items), budget, chosen.dropped, notes)


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
