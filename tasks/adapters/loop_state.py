"""The loop's state in the store: window claims (Lua), the observations lock, the next tick,
each warm-up's outcome for status, and the engine's recent plan ids."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

import pandas as pd
import redis

from tasks.adapters import redis_keys
from tasks.adapters.plan_store import PlanStore

#: Longest a tick waits for another process updating the same engine's observations.
LOCK_WAIT_S = 60.0
LOCK_TIMEOUT_S = 600
# The engine's last claimed window: a tick claims its window only if no later or equal one was
# claimed, so each window ticks once, whoever runs it, with one key per engine.
_CLAIM_WINDOW = """
local last = tonumber(redis.call('get', KEYS[1]) or '-1')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('set', KEYS[1], ARGV[1])
return 1
"""
_RELEASE_WINDOW = """
if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('del', KEYS[1]) end
return 0
"""


class LoopState:
    """One engine-independent view of the loop's keys on the store client ``store``."""

    def __init__(self, store: redis.Redis) -> None:
        self.store = store
        self._claim = store.register_script(_CLAIM_WINDOW)
        self._release = store.register_script(_RELEASE_WINDOW)

    def observations_lock(self, engine: str) -> Any:
        """The lock one process holds while it updates ``engine``'s observations."""
        return self.store.lock(
            redis_keys.LOOP_LOCK.format(engine=engine),
            timeout=LOCK_TIMEOUT_S, blocking_timeout=LOCK_WAIT_S,
        )  # fmt: skip

    def pending(self, engine: str) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
        """Records and counts read but not yet written to the shared store (None: none)."""
        raw = self.store.hgetall(redis_keys.LOOP_PENDING_OBSERVATIONS.format(engine=engine))
        return _frame(raw.get(b"records")), _frame(raw.get(b"counts"))

    def keep_pending(
        self, engine: str, records: pd.DataFrame | None, counts: pd.DataFrame | None
    ) -> None:
        """Keep what a tick read until the shared store takes it (replaces what was kept: the
        caller passes the pending frames merged with its own)."""
        key = redis_keys.LOOP_PENDING_OBSERVATIONS.format(engine=engine)
        parts: dict[Any, Any] = {name: _parquet(frame) for name, frame in (("records", records),
                 ("counts", counts)) if frame is not None and len(frame)}  # fmt: skip
        with self.store.pipeline() as pipe:
            pipe.delete(key)
            if parts:
                pipe.hset(key, mapping=parts)
            pipe.execute()

    def clear_pending(self, engine: str) -> None:
        self.store.delete(redis_keys.LOOP_PENDING_OBSERVATIONS.format(engine=engine))

    def claim_window(self, engine: str, start: float) -> bool:
        """Claim the tick of ``engine``'s window starting at ``start`` (False: already done)."""
        claim = redis_keys.LOOP_TICK_CLAIM.format(engine=engine)
        return bool(self._claim(keys=[claim], args=[repr(start)]))

    def release_window(self, engine: str, start: float) -> None:
        """Give a claimed window back (its tick failed: a retry may run it again)."""
        self._release(keys=[redis_keys.LOOP_TICK_CLAIM.format(engine=engine)], args=[repr(start)])

    def kv_window(self, engine: str) -> float | None:
        """The start of the last KV-event count window taken into ``engine``'s observations."""
        raw = self.store.get(redis_keys.LOOP_KV_WINDOW.format(engine=engine))
        return None if raw is None else float(raw)

    def set_kv_window(self, engine: str, start: float) -> None:
        self.store.set(redis_keys.LOOP_KV_WINDOW.format(engine=engine), repr(start))

    def next_tick(self, engine: str) -> float | None:
        raw = self.store.get(redis_keys.LOOP_NEXT_TICK.format(engine=engine))
        return None if raw is None else float(raw)

    def set_next_tick(self, engine: str, at: float) -> None:
        self.store.set(redis_keys.LOOP_NEXT_TICK.format(engine=engine), at)

    def record_outcome(self, engine: str, reason: str, body: str, tick: bool) -> None:
        """Keep one warm-up's outcome (JSON) as the engine's last for ``reason`` (and its last
        tick's, for a window tick)."""
        with self.store.pipeline(transaction=True) as pipe:
            if tick:
                pipe.set(redis_keys.LOOP_LAST_TICK.format(engine=engine), body)
            pipe.hset(redis_keys.LOOP_LAST_PLANS.format(engine=engine), reason, body)
            pipe.execute()

    def set_window_predictions(self, engine: str, predicted: Mapping[str, float]) -> None:
        """What the window tick's plan predicted for the window it warms (replacing the last)."""
        key = redis_keys.LOOP_WINDOW_PREDICTIONS.format(engine=engine)
        with self.store.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            if predicted:
                pipe.hset(key, mapping={k: repr(float(v)) for k, v in predicted.items()})
            pipe.execute()

    def window_predictions(self, engine: str) -> dict[str, float] | None:
        """What the last window tick's plan predicted (None: no window tick planned yet)."""
        raw = self.store.hgetall(redis_keys.LOOP_WINDOW_PREDICTIONS.format(engine=engine))
        return {_text(k): float(v) for k, v in raw.items()} if raw else None

    def set_drift(self, engine: str, since: float, until: float, kind: str) -> None:
        """A drift of ``kind`` moved ``engine``'s workload at ``since`` (Unix seconds): plans
        weight the windows from there on until ``until``."""
        body = json.dumps({"since": since, "until": until, "kind": kind})
        self.store.set(redis_keys.LOOP_DRIFT.format(engine=engine), body)

    def drift(self, engine: str) -> dict[str, Any] | None:
        """The engine's last drift (``since``, ``until``, ``kind``), or None."""
        raw = self.store.get(redis_keys.LOOP_DRIFT.format(engine=engine))
        return None if raw is None else dict(json.loads(raw))

    def keep_recent_plans(self, engine: str, plan_id: str, keep: int) -> None:
        """Remember ``plan_id`` among the engine's ``keep`` newest plans; older ones are deleted."""
        key = redis_keys.LOOP_PLAN_IDS.format(engine=engine)
        self.store.lpush(key, plan_id)
        old = [_text(p) for p in self.store.lrange(key, keep, -1)]
        if old:
            self.store.ltrim(key, 0, keep - 1)
            plans = PlanStore(self.store)
            for stale in old:
                plans.delete(stale)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _parquet(frame: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


def _frame(raw: bytes | str | None) -> pd.DataFrame | None:
    if raw is None:
        return None
    return pd.read_parquet(io.BytesIO(raw if isinstance(raw, bytes) else raw.encode("latin-1")))
