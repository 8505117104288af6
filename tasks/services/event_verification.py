"""Verification by the engine's word: a prefix primed with token ids is verified when the
replica's KV-cache events (followed by :mod:`tasks.services.kv_follow`) show its whole chain
held; the rest are left to the probe.

    confirmed_by_events(items, results, ctx, wait_s) -> (items, results) still to probe
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pipeline.kv_holdings import chain_content_keys
from pipeline.planner.plan import WarmItem
from tasks.adapters.kv_state import KvStateStore
from tasks.adapters.targets.base import BatchContext, ItemResult

#: How long verification waits for the engine's events after priming.
VERIFY_WAIT_S = 3.0


def _expected(item: WarmItem, block_size: int) -> list[str]:
    salt = item.params.get("cache_salt")
    ids = item.token_ids or ()
    return chain_content_keys(ids, block_size, item.adapter, str(salt) if salt else None)


def confirmed_by_events(
    items: Sequence[WarmItem],
    results: Sequence[ItemResult],
    ctx: BatchContext,
    wait_s: float = VERIFY_WAIT_S,
) -> tuple[list[WarmItem], list[ItemResult]]:
    """The items (and their results) still to verify by a probe after the engine's events
    confirmed what they could: a primed token-id prefix whose every block the replica now
    holds (a ``BlockStored`` for it, or held already) is verified without a probe request."""
    state = KvStateStore(ctx.store, ctx.engine.engine.name)
    waiting = [i for i, (item, result) in enumerate(zip(items, results, strict=True))
               if result.ok and item.kind == "prefix" and item.token_ids]  # fmt: skip
    size = state.block_size() if waiting and state.alive() else None
    if size is None:
        return list(items), list(results)
    expected = {i: _expected(items[i], size) for i in waiting}
    deadline = time.monotonic() + wait_s
    while waiting:
        waiting = [i for i in waiting if not state.held_all(expected[i])]
        if not waiting or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    confirmed = {i for i in expected if i not in waiting}
    rest = [i for i in range(len(items)) if i not in confirmed]
    return [items[i] for i in rest], [results[i] for i in rest]
