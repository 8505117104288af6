"""The write-ahead log in Redis: transactions, effect records, leases, rollback, recovery sweep.

Layout (all under ``pw:wal:``)::

    txn:<id>      hash  state, plan_id, batch, engine, owner, created
    fx:<id>       list  effect records (JSON, pipeline.wal.Effect), appended before each effect
    active        zset  open txn id -> lease deadline (unix seconds)

Rules kept here: a record is written before its effect; where the effect is on Redis the
before-image, the record and the write go in one ``MULTI`` (``apply_redis``); every write of a
transaction's worker is fenced by ``WATCH`` on the txn hash and its ``owner``, so a worker
whose lease was taken over by the sweep can write nothing more. Rollback reads only the WAL.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

from pipeline.errors import ConsistencyError
from pipeline.wal import (
    FINAL_STATES,
    Effect,
    Transaction,
    TxnState,
    check_move,
    is_orphaned,
    redis_before_image,
    rollback_order,
    sources,
)
from tasks.adapters import redis_keys
from tasks.adapters.telemetry import record_wal

PREFIX = redis_keys.WAL_PREFIX
ACTIVE = PREFIX + "active"
# Fenced writes as Lua: atomic like MULTI/EXEC, one round trip instead of four or five.
_MOVE = """
if redis.call('hget', KEYS[1], 'owner') ~= ARGV[1] then return -1 end
local current = redis.call('hget', KEYS[1], 'state')
for i = 3, #ARGV do
  if current == ARGV[i] then redis.call('hset', KEYS[1], 'state', ARGV[2]) return 1 end
end
return -2
"""
_RECORD = """
if redis.call('hget', KEYS[1], 'owner') ~= ARGV[1] then return -1 end
return redis.call('rpush', KEYS[2], unpack(ARGV, 2))
"""
_RENEW = """
if redis.call('hget', KEYS[1], 'owner') == ARGV[1] then
  redis.call('zadd', KEYS[2], 'XX', ARGV[2], ARGV[3]) return 1 end
return 0
"""


class LeaseLost(ConsistencyError):
    """This worker no longer owns the transaction (the sweep took it over): stop writing."""


@dataclass(frozen=True, slots=True)
class RedisWrite:
    """One cache write of an effect: set ``key`` to ``value`` (None = delete), with a TTL."""

    key: str
    value: str | None
    ttl_s: int | None = None
    item_key: str = ""


#: Compensating engine call for a reversible engine effect, by ``Effect.undo['op']``.
EngineUndo = Callable[[Effect], None]


def as_text(raw: Any) -> str:
    """A Redis reply as text (replies are bytes unless the client decodes)."""
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def txn_key(txn_id: str) -> str:
    return f"{PREFIX}txn:{txn_id}"


def fx_key(txn_id: str) -> str:
    return f"{PREFIX}fx:{txn_id}"


#: A clock in unix seconds (``time.time``); a test passes one it steps by hand.
Clock = Callable[[], float]


class WalStore:
    """The WAL of one Redis store; ``lease_s`` is how long a transaction lives unrenewed.

    Leases are read and written against ``clock`` (unix seconds), so a test steps time past a
    lease instead of sleeping it out.
    """

    def __init__(
        self, client: redis.Redis, lease_s: float = 30.0, clock: Clock = time.time
    ) -> None:
        self.r = client
        self.lease_s = lease_s
        self.clock = clock
        self._renew = client.register_script(_RENEW)
        self._move = client.register_script(_MOVE)
        self._record = client.register_script(_RECORD)

    # -- lifecycle -------------------------------------------------------------------------
    def begin(
        self,
        plan_id: str,
        batch: int,
        engine: str,
        owner: str | None = None,
        extra: Callable[[redis.client.Pipeline, str], None] | None = None,
    ) -> Transaction:
        """Open a transaction with a fresh lease; its id is unique per attempt. ``extra`` adds
        writes (given the new id) to the same ``MULTI``."""
        txn = Transaction(uuid.uuid4().hex[:16], plan_id, batch, engine)
        now = self.clock()
        fields = {
            "state": txn.state.value, "plan_id": plan_id, "batch": batch, "engine": engine,
            "owner": owner or txn.txn_id, "created": now,
        }  # fmt: skip
        with self.r.pipeline() as pipe:
            pipe.hset(txn_key(txn.txn_id), mapping={k: str(v) for k, v in fields.items()})
            pipe.zadd(ACTIVE, {txn.txn_id: now + self.lease_s})
            if extra is not None:
                extra(pipe, txn.txn_id)
            pipe.execute()
        return txn

    def owner_of(self, txn_id: str) -> str:
        raw = self.r.hget(txn_key(txn_id), "owner")
        return as_text(raw) if raw else ""

    def engine_of(self, txn_id: str) -> str:
        """The engine the transaction warms ("" when it is unknown)."""
        raw = self.r.hget(txn_key(txn_id), "engine")
        return as_text(raw) if raw else ""

    def renew(self, txn_id: str, owner: str) -> bool:
        """Extend the lease; False when the sweep has taken the transaction over."""
        deadline = self.clock() + self.lease_s
        return bool(self._renew(keys=[txn_key(txn_id), ACTIVE], args=[owner, deadline, txn_id]))

    def state(self, txn_id: str) -> TxnState | None:
        raw = self.r.hget(txn_key(txn_id), "state")
        return TxnState(as_text(raw)) if raw else None

    def move(self, txn_id: str, owner: str, target: TxnState) -> None:
        """Step the state machine, fenced by ownership; illegal steps raise."""
        allowed = [state.value for state in sources(target)]
        done = self._move(keys=[txn_key(txn_id)], args=[owner, target.value, *allowed])
        if done == -1:
            raise LeaseLost(f"transaction {txn_id} is no longer owned by {owner}")
        if done == -2:
            check_move(txn_id, self.state(txn_id) or TxnState.BEGIN, target)

    def _state_of(self, pipe: redis.client.Pipeline, txn_id: str) -> TxnState:
        raw = pipe.hget(txn_key(txn_id), "state")
        if raw is None:
            raise ConsistencyError(f"transaction {txn_id} is not in the WAL")
        return TxnState(as_text(raw))

    def _check_owner(self, pipe: redis.client.Pipeline, txn_id: str, owner: str) -> None:
        current = pipe.hget(txn_key(txn_id), "owner")
        if current is None or as_text(current) != owner:
            raise LeaseLost(f"transaction {txn_id} is no longer owned by {owner}")

    # -- effects ---------------------------------------------------------------------------
    def next_seq(self, txn_id: str) -> int:
        return int(self.r.llen(fx_key(txn_id)))

    def record(self, txn_id: str, owner: str, effects: Sequence[Effect]) -> int:
        """Append effect records (engine effects) before the effects happen; returns the
        number of records the transaction has now."""
        if not effects:
            return self.next_seq(txn_id)
        args = [owner, *(e.to_json() for e in effects)]
        count = int(self._record(keys=[txn_key(txn_id), fx_key(txn_id)], args=args))
        if count == -1:
            raise LeaseLost(f"transaction {txn_id} is no longer owned by {owner}")
        return count

    def apply_redis(
        self, txn_id: str, owner: str, writes: Sequence[RedisWrite], op: str = "set"
    ) -> int:
        """Before-images, effect records and the writes themselves, in one ``MULTI``; returns
        the number of records the transaction has now."""
        if not writes:
            return self.next_seq(txn_id)
        keys = [w.key for w in writes]
        count = [0]

        def apply(pipe: redis.client.Pipeline) -> None:
            self._check_owner(pipe, txn_id, owner)
            befores = _before_images(pipe, keys)
            seq = int(pipe.llen(fx_key(txn_id)))
            pipe.multi()
            records = [
                Effect(seq + i, "redis", op, w.key, True, befores[w.key], None, w.item_key)
                for i, w in enumerate(writes)
            ]
            pipe.rpush(fx_key(txn_id), *[r.to_json() for r in records])
            for w in writes:
                _write(pipe, w.key, w.value, w.ttl_s)
            count[0] = seq + len(records)

        self.r.transaction(apply, txn_key(txn_id), *keys)
        return count[0]

    def effects(self, txn_id: str) -> list[Effect]:
        return [Effect.from_json(raw) for raw in self.r.lrange(fx_key(txn_id), 0, -1)]

    def load(self, txn_id: str) -> Transaction | None:
        """The transaction with its effects and lease, or None when unknown."""
        raw = self.r.hgetall(txn_key(txn_id))
        if not raw:
            return None
        fields = {as_text(k): as_text(v) for k, v in raw.items()}
        lease = self.r.zscore(ACTIVE, txn_id)
        return Transaction(
            txn_id, fields["plan_id"], int(fields["batch"]), fields["engine"],
            TxnState(fields["state"]), float(lease or 0.0), tuple(self.effects(txn_id)),
        )  # fmt: skip

    # -- end of a transaction --------------------------------------------------------------
    def finish(
        self,
        txn_id: str,
        owner: str,
        state: TxnState,
        restore_keys: Iterable[str] = (),
        extra: Callable[[redis.client.Pipeline], None] | None = None,
    ) -> None:
        """Commit (restoring ``restore_keys``, the entries that failed verification) or roll
        back (restoring every Redis effect), atomically with the state change and ``extra``."""
        restore = set(restore_keys)

        def end(pipe: redis.client.Pipeline) -> None:
            current_owner, current = pipe.hmget(txn_key(txn_id), ["owner", "state"])
            if current_owner is None or as_text(current_owner) != owner:
                raise LeaseLost(f"transaction {txn_id} is no longer owned by {owner}")
            check_move(txn_id, TxnState(as_text(current)), state)
            effects = []
            if restore or state == TxnState.ROLLED_BACK:  # a clean commit restores nothing
                effects = [Effect.from_json(raw) for raw in pipe.lrange(fx_key(txn_id), 0, -1)]
            pipe.multi()
            for effect in rollback_order(effects):
                if effect.target == "redis" and (
                    state == TxnState.ROLLED_BACK or effect.key in restore
                ):
                    _restore(pipe, effect)
            pipe.hset(txn_key(txn_id), mapping={"state": state.value, "ended": self.clock()})
            pipe.zrem(ACTIVE, txn_id)
            if extra is not None:
                extra(pipe)

        self.r.transaction(end, txn_key(txn_id))

    def rollback(
        self,
        txn_id: str,
        owner: str,
        engine_undo: EngineUndo | None = None,
        extra: Callable[[redis.client.Pipeline], None] | None = None,
    ) -> None:
        """Undo engine effects newest first, then restore Redis and mark rolled back.

        Idempotent: a rolled-back transaction is left alone; engine undo steps tolerate being
        repeated (unloading an adapter that is gone is done).
        """
        if self.state(txn_id) in FINAL_STATES:
            return
        for effect in rollback_order(self.effects(txn_id)):
            if effect.target != "redis" and effect.undo:  # an engine's or a gateway's
                if engine_undo is None:
                    raise ConsistencyError(f"{txn_id}: engine effect {effect.op} needs an undo")
                engine_undo(effect)
        self.finish(txn_id, owner, TxnState.ROLLED_BACK, extra=extra)

    # -- recovery --------------------------------------------------------------------------
    def expired(self, now: float | None = None) -> list[str]:
        """Open transactions whose lease ran out."""
        now = self.clock() if now is None else now
        return [as_text(raw) for raw in self.r.zrangebyscore(ACTIVE, "-inf", now)]

    def is_live(self, txn_id: str, now: float | None = None) -> bool:
        """Whether the transaction is open with a lease that has not run out."""
        now = self.clock() if now is None else now
        lease = self.r.zscore(ACTIVE, txn_id)
        return lease is not None and float(lease) >= now

    def take_over(self, txn_id: str, owner: str, now: float | None = None) -> bool:
        """Make ``owner`` the owner of an orphaned transaction; False if it is alive or done."""
        now = self.clock() if now is None else now

        def grab(pipe: redis.client.Pipeline) -> bool:
            txn = self._orphan(pipe, txn_id)
            if txn is None or not is_orphaned(txn, now):
                return False
            pipe.multi()
            pipe.hset(txn_key(txn_id), "owner", owner)
            pipe.zadd(ACTIVE, {txn_id: now + self.lease_s})
            return True

        try:
            grabbed = self.r.transaction(
                cast(Callable[[Any], None], grab), txn_key(txn_id), ACTIVE, value_from_callable=True
            )
            return bool(grabbed)
        except redis.WatchError:
            return False

    def _orphan(self, pipe: redis.client.Pipeline, txn_id: str) -> Transaction | None:
        state = pipe.hget(txn_key(txn_id), "state")
        lease = pipe.zscore(ACTIVE, txn_id)
        if state is None:
            pipe.zrem(ACTIVE, txn_id)  # a lease without a record: nothing to undo
            return None
        return Transaction(txn_id, "", 0, "", TxnState(as_text(state)), float(lease or 0.0))

    def sweep(
        self,
        engine_undo_for: Callable[[str], EngineUndo] | None = None,
        now: float | None = None,
    ) -> list[str]:
        """Roll back every transaction whose lease expired by ``now``; returns their ids."""
        swept: list[str] = []
        for txn_id in self.expired(now):
            me = f"sweep-{uuid.uuid4().hex[:8]}"
            if not self.take_over(txn_id, me, now):
                continue
            engine = as_text(self.r.hget(txn_key(txn_id), "engine") or b"")
            undo = engine_undo_for(engine) if engine_undo_for else None
            try:
                self.rollback(txn_id, me, undo)
            except LeaseLost:
                continue  # another recoverer took it over after our lease ran out; it finishes
            swept.append(txn_id)
            record_wal(self.r, engine, "recovered")
        return swept

    def summary(self, limit: int = 50) -> dict[str, Any]:
        """Open transactions with their lease left, for ``prewarm wal status``."""
        now = self.clock()
        rows = []
        listed = cast(
            list[tuple[bytes, float]], self.r.zrange(ACTIVE, 0, limit - 1, withscores=True)
        )
        for raw, deadline in listed:
            txn = self.load(as_text(raw))
            if txn is not None:
                rows.append(_row(txn, deadline - now))
        return {"open": int(self.r.zcard(ACTIVE)), "transactions": rows}


def _row(txn: Transaction, lease_left: float) -> dict[str, Any]:
    kept = sum(1 for e in txn.effects if not e.reversible)
    return {
        "txn": txn.txn_id, "plan": txn.plan_id, "batch": txn.batch, "engine": txn.engine,
        "state": txn.state.value, "lease_left_s": round(lease_left, 1),
        "effects": len(txn.effects), "irreversible": kept,
    }  # fmt: skip


def _before_images(pipe: redis.client.Pipeline, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    unique = list(dict.fromkeys(keys))
    values = pipe.mget(unique)
    ttls = [pipe.pttl(key) for key in unique]
    return {k: redis_before_image(v, t) for k, v, t in zip(unique, values, ttls, strict=True)}


def _write(pipe: redis.client.Pipeline, key: str, value: str | None, ttl_s: int | None) -> None:
    if value is None:
        pipe.delete(key)
    elif ttl_s:
        pipe.set(key, value, ex=ttl_s)
    else:
        pipe.set(key, value)


def _restore(pipe: redis.client.Pipeline, effect: Effect) -> None:
    before = effect.before or {"value": None, "ttl_ms": -1}
    if before.get("value") is None:
        pipe.delete(effect.key)
    elif int(before.get("ttl_ms", -1)) > 0:
        pipe.set(effect.key, before["value"], px=int(before["ttl_ms"]))
    else:
        pipe.set(effect.key, before["value"])


def decode_json(raw: bytes | str | None) -> Any:
    """JSON from a Redis value, or None."""
    return None if raw is None else json.loads(raw)
