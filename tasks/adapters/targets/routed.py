"""Prefixes warmed through a router that remembers what it routed (``cache_aware``).

Each prefix is one request through the router, exactly as its users send it (chat as chat, a
text prompt alone, no header of prewarm's), so the router's prefix tree learns where it lives.
Where the router keys its tree on a request's text, a prefix read from a chat's rendered prompt
goes as that chat's messages (:func:`as_users_send`).
Where it landed is read at every replica's own URL: the one replica whose ``/metrics`` counted
the prime's prompt tokens as prefix-cache lookups (vLLM counts lookups only while its prefix
cache is on, and keeps every whole block it computes, so that count is also the proof that the
prefix is held there). The router's own ``/metrics`` answer for one replica of its choosing and
are never read. With traffic on several replicas at once a prime's replica cannot be told
apart: the item fails as unplaced rather than being counted where it may not be. Costs: one
``GET /metrics`` per replica before the batch and after each prime.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from pipeline.chat_forms import chat_messages
from pipeline.errors import PrewarmError
from pipeline.planner.plan import WarmItem
from tasks.adapters import fleet_state
from tasks.adapters.engine_client import Completion
from tasks.adapters.targets.base import BatchContext, ItemResult, RoutedFleet
from tasks.adapters.targets.prefix import irreversible


def landing(
    before: Mapping[str, float | None], after: Mapping[str, float | None], prompt_tokens: int
) -> tuple[str, str]:
    """The replica a prime of ``prompt_tokens`` landed on, from every replica's lookups before
    and after it: (replica, "") or ("", why not)."""
    grew = {
        name: (after[name] or 0.0) - (before.get(name) or 0.0)
        for name in after
        if after[name] is not None and (after[name] or 0.0) > (before.get(name) or 0.0)
    }
    if len(grew) == 1:
        return next(iter(grew)), ""
    whole = [name for name, delta in grew.items() if delta >= prompt_tokens]
    if len(whole) == 1:
        return whole[0], ""
    if not grew:
        return "", "placement: no replica's /metrics counted the prime"
    return "", f"placement: {len(grew)} replicas counted lookups at once (traffic)"


def counted(
    routed: RoutedFleet,
    before: Mapping[str, float | None],
    prompt_tokens: int,
    wait_s: float = 2.0,
    every_s: float = 0.05,
) -> dict[str, float | None]:
    """Every replica's lookups once they count a prime of ``prompt_tokens`` (vLLM adds a
    request's prompt tokens to its lookups), or as they are after ``wait_s``. vLLM publishes a
    request's counts to ``/metrics`` a moment after answering it: read at once, a prime's count
    could land in the next prime's delta, two replicas grew, and that prime failed as unplaced
    (seen on two vLLM CPU replicas behind vllm-router)."""
    deadline = time.monotonic() + wait_s
    while True:
        after = routed.lookups()
        grown = sum(max(0.0, (v or 0.0) - (before.get(k) or 0.0)) for k, v in after.items())
        if grown >= prompt_tokens or time.monotonic() >= deadline:
            return after
        time.sleep(every_s)


def as_users_send(item: WarmItem) -> WarmItem:
    """``item`` as its chat users send it: a text prefix read from a chat's rendered prompt
    (planned with ``add_special_tokens`` off) as the chat's messages; any other unchanged."""
    if item.messages is not None or item.text is None:
        return item
    if item.params.get("add_special_tokens") is not False:
        return item
    messages = chat_messages(item.text)
    if messages is None:
        return item
    params = {k: v for k, v in item.params.items() if k != "add_special_tokens"}
    return replace(item, text=None, messages=messages, params=params, endpoint="chat")


def _prime(item: WarmItem, routed: RoutedFleet) -> Completion:
    """One request for ``item`` through the router, as its users send it."""
    max_tokens = int(item.params.get("max_tokens", 1)) if item.kind == "shape" else 1
    sent = as_users_send(item) if routed.text_keyed else item
    return routed.router.complete(sent, max_tokens=max_tokens)


def _send(
    item: WarmItem, routed: RoutedFleet, result: ItemResult, before: dict[str, float | None]
) -> dict[str, float | None]:
    """Prime ``item`` through the router; returns the replicas' lookups after it."""
    try:
        done = _prime(item, routed)
    except PrewarmError as exc:
        result.fail(str(exc))
        return routed.lookups()
    result.prime = done
    after = counted(routed, before, done.prompt_tokens)
    replica, why = landing(before, after, done.prompt_tokens)
    if replica:
        result.replica = replica
    else:
        result.fail(why)
    return after


def spread(
    items: Sequence[WarmItem], routed: RoutedFleet, results: Sequence[ItemResult]
) -> list[str]:
    """The first pass after a router restart: primes sent in groups of as many as the fleet
    has replicas, each group at once. A router whose memory is empty places a prefix it has
    not seen by load, ties to the same worker: sent one by one, every prime — and so every
    user after them — landed on one replica (8/0/0, where the users had been spread 3/3/2,
    on simulator replicas behind sglang-router 0.3.2 and vllm-router 0.1.17 ``cache_aware``).
    Sent together, each goes to the least loaded replica. Returns the engine request ids."""
    size = max(1, len(routed.replicas))

    def prime(pair: tuple[WarmItem, ItemResult]) -> str:
        item, result = pair
        try:
            return _prime(item, routed).request_id
        except PrewarmError as exc:
            result.fail(str(exc))
            return ""

    pairs = list(zip(items, results, strict=True))
    with ThreadPoolExecutor(size, thread_name_prefix="prewarm-spread") as pool:
        return [rid for n in range(0, len(pairs), size)
                for rid in pool.map(prime, pairs[n : n + size])]  # fmt: skip


def apply(items: Sequence[WarmItem], ctx: BatchContext) -> list[ItemResult]:
    """Send every prefix (and shape) through the router, one per request, in plan order; after
    a router restart (``routed.spread``), first in groups at once (:func:`spread`), then each
    again alone, which the router sends where it placed it and whose landing is read there."""
    routed = ctx.routed
    assert routed is not None  # (only routed batches come here)
    irreversible(items, ctx, "prime")
    results = [ItemResult(item.key, item.kind) for item in items]
    sent = spread(items, routed, results) if routed.spread else []
    lookups = routed.lookups()
    for item, result in zip(items, results, strict=True):
        if result.ok:
            lookups = _send(item, routed, result, lookups)
    sent += [r.prime.request_id for r in results if r.prime is not None]
    fleet_state.remember_sent(ctx.store, [rid for rid in sent if rid], time.time())
    return results


def verify(items: Sequence[WarmItem], results: Sequence[ItemResult], ctx: BatchContext) -> None:
    """A prime that landed on one replica, whose own ``/metrics`` counted it, is verified
    there: that replica is where the router will send the prefix's users."""
    for result in results:
        if result.ok and result.replica:
            result.verified_by = "prime"
