"""Verification as a user sees it: once a whole plan is primed, is each item still held on the
replica its users reach?

A batch verifies an item by its own prime (the engine counted the prompt as cached lookups, or
its events stored it). That says *primed*, not *held*: with a real cache smaller than the
settings say, a later prime of the same plan evicts an earlier one, and every item was still
reported verified (2 of 8 first uses from cache, 9 of 9 "verified", on simulator replicas of
128 blocks behind vllm-router ``power_of_two``). So when the plan's last batch is done, every
item a batch verified is checked again on the replica it landed on — read from that replica,
never through the router:

- a prefix primed as token ids on a replica whose KV-cache events prewarm follows: its whole
  chain is in the replica's held set (no request). Where the events miss an item, every item of
  the replica is probed instead: blocks stored before the follower saw the replica restart are
  not in its held set, and a prime of what the engine already holds publishes nothing again
  (on real vLLM a restarted gated replica held all six items of its plan by the engine's own
  count, and one was never in its events: it was warmed again and again until its deadline);
- any other: one probe at the replica's own URL (``max_tokens`` 1, prewarm's own request id, so
  the loop does not read it back as demand), which must find every whole block of the prompt
  cached (``cached_tokens``), in plan order, oldest prime first: a probe of an item still held
  moves nothing out; one that misses re-primes it, and can push out only what is older still.

An item not held is taken off the plan's verified count and counted failed, with why; each
replica keeps the items it was found holding (what ``prewarm status`` counts per replica,
wherever the plan meant them to go). Engines that report no ``cached_tokens`` (llama.cpp, TGI)
keep their batch's verification: they are listed as not checked.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import EngineUnavailableError, PrewarmError
from pipeline.kv_holdings import chain_content_keys
from pipeline.planner.plan import WarmItem
from tasks.adapters import replica_holdings
from tasks.adapters.engine_client import EngineClient, RetryPolicy
from tasks.adapters.engine_semaphore import EngineSemaphore
from tasks.adapters.engine_tokens import engine_cache
from tasks.adapters.kv_state import KvStateStore
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.store import Store
from tasks.services.batch_runner import ROUTED_SLOT
from tasks.settings import EngineSettings, Settings

#: failures named in a plan's holdings record (the rest are counted)
NAMED_FAILURES = 10
#: a probe is one block and a token of prefill: a replica that takes longer is not answering
PROBE_TIMEOUT_S = 10.0


@dataclass
class Holdings:
    """What a plan's check found: per replica, the item keys it holds and those it does not."""

    held: dict[str, list[str]] = field(default_factory=dict)
    missing: dict[str, list[str]] = field(default_factory=dict)
    unchecked: dict[str, list[str]] = field(default_factory=dict)
    why: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        def counts(rows: dict[str, list[str]]) -> dict[str, int]:
            return {replica: len(keys) for replica, keys in sorted(rows.items()) if keys}

        return {
            "held": sum(map(len, self.held.values())),
            "not_held": sum(map(len, self.missing.values())),
            "unchecked": sum(map(len, self.unchecked.values())),
            "held_per_replica": counts(self.held),
            "not_held_per_replica": counts(self.missing),
            "failures": self.why[:NAMED_FAILURES],
        }


def verified_items(plans: PlanStore, plan_id: str) -> dict[str, list[WarmItem]]:
    """Per replica, the prefixes the plan's batches verified there, in plan order."""
    report = plans.report(plan_id)
    out: dict[str, list[WarmItem]] = {}
    for batch in range(report["batches"]):
        result = plans.result(plan_id, batch)
        if result is None or result.get("state") != "committed":
            continue
        items, _, _ = plans.load_batch(plan_id, batch)
        by_key = {item.key: item for item in items}
        for key, replica in (result.get("held_on") or {}).items():
            if key in by_key:
                out.setdefault(replica, []).append(by_key[key])
    return out


def whole_blocks(prompt_tokens: int, block: int | None) -> int:
    """Tokens of a prompt's whole blocks an engine can reuse (it recomputes the last token)."""
    if block is None or block <= 0:
        return max(1, prompt_tokens // 2)
    return ((prompt_tokens - 1) // block) * block if prompt_tokens else 0


def _block_size(engine: EngineSettings) -> int | None:
    published = engine_cache(engine)
    return published[0] if published is not None else engine.cache_block_tokens


def _by_events(engine: EngineSettings, store: Store, items: Sequence[WarmItem]) -> dict[str, bool]:
    """Held or not for each token-id item, from the replica's KV-event state (where followed)."""
    state = KvStateStore(store, engine.name)
    size = state.block_size() if state.alive() else None
    if size is None:
        return {}
    out = {}
    for item in items:
        if item.token_ids:
            salt = item.params.get("cache_salt")
            keys = chain_content_keys(item.token_ids, size, item.adapter, salt and str(salt))
            out[item.key] = state.held_all(keys)
    return out


def _probe(client: EngineClient, item: WarmItem, block: int | None) -> tuple[bool | None, str]:
    """(held, why not) by one probe; held None: the engine reports no cached tokens. A replica
    that does not answer raises :class:`EngineUnavailableError` (its other items are not probed)."""
    try:
        probe = client.complete(item, max_tokens=1)
    except EngineUnavailableError:
        raise
    except PrewarmError as exc:
        return False, f"probe failed: {exc}"
    if probe.cached_tokens is None:
        return None, ""
    need = whole_blocks(probe.prompt_tokens, block)
    if probe.cached_tokens >= need:
        return True, ""
    return False, f"{probe.cached_tokens} of {need} tokens cached"


def _quiet_fleet(
    engine: EngineSettings, store: Store, hold_s: float
) -> AbstractContextManager[Any]:
    """The fleet's road through its router, held while a replica of it is probed: a prime
    through the router is placed by the one replica whose lookups grew, and a probe at the same
    moment would make it two."""
    if engine.fleet is None:
        return nullcontext()
    return EngineSemaphore(store, f"{ROUTED_SLOT}{engine.fleet}", 1, hold_s=hold_s).slot()


def check_replica(
    engine: EngineSettings, store: Store, items: Sequence[WarmItem], found: Holdings,
    hold_s: float = 600.0,
) -> None:  # fmt: skip
    """Check ``items`` (plan order) on replica ``engine``, adding what was found to ``found``."""
    with _quiet_fleet(engine, store, hold_s):
        _check_replica(engine, store, items, found)


def _check_replica(
    engine: EngineSettings, store: Store, items: Sequence[WarmItem], found: Holdings
) -> None:
    events = _by_events(engine, store, items)
    # the events' word where they hold every item they know; else the engine's, for all of them,
    # in plan order (a probe of an item still held moves nothing out)
    by_events = events if all(events.values()) else {}
    block = _block_size(engine) if len(by_events) < len(items) else None
    client = EngineClient(engine, timeout_s=PROBE_TIMEOUT_S, retry=RetryPolicy(attempts=2))
    down = ""
    try:
        for item in items:
            held: bool | None
            if down:
                held, why = False, down
            elif item.key in by_events:
                held, why = by_events[item.key], "not in its KV events"
            else:
                try:
                    held, why = _probe(client, item, block)
                except EngineUnavailableError as exc:
                    down = f"the replica does not answer ({exc})"
                    held, why = False, down
                if held is None and item.key in events:  # (no cached count: the events' word)
                    held, why = events[item.key], "not in its KV events"
            row = found.unchecked if held is None else found.held if held else found.missing
            row.setdefault(engine.name, []).append(item.key)
            if held is False:
                found.why.append(f"{item.key} on {engine.name}: {why}")
    finally:
        client.close()


def check_plan_holdings(
    settings: Settings, store: Store, plan_id: str, now: float | None = None
) -> dict[str, Any]:
    """Check every item the plan's batches verified on the replica it landed on; record what
    was found on the plan (its verified and failed counts) and on each replica. ``settings``:
    with every fleet's current replicas. Returns the plan's holdings record."""
    now = time.time() if now is None else now
    plans = PlanStore(store)
    found = Holdings()
    known = {engine.name: engine for engine in settings.engines}
    for replica, items in verified_items(plans, plan_id).items():
        engine = known.get(replica)
        if engine is None:  # (gone from the fleet since: nothing of it to hold)
            found.missing[replica] = [item.key for item in items]
            found.why.append(f"{len(items)} items on {replica}: the replica left the fleet")
            continue
        check_replica(engine, store, items, found, settings.wal_lease_s)
    record = found.to_dict()
    plans.record_holdings(plan_id, record)
    for replica in set(found.held) | set(found.missing):
        replica_holdings.update(
            store, replica, found.held.get(replica, ()), found.missing.get(replica, ()), now
        )
    return record
