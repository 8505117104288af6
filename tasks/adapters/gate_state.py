"""Each gated replica's episode (:class:`pipeline.gate.GateRecord`), in the store: what the gate
service writes, and what ``/ready/{replica}``, ``prewarm status`` and ``/metrics`` read."""

from __future__ import annotations

import json

import redis

from pipeline.gate import GateRecord
from tasks.adapters import redis_keys


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def load(store: redis.Redis, fleet: str, engine: str) -> GateRecord | None:
    """The replica's last episode (None: the gate never saw it)."""
    raw = store.hget(redis_keys.GATE.format(fleet=fleet), engine)
    return None if raw is None else GateRecord.from_dict(json.loads(raw))


def save(store: redis.Redis, record: GateRecord) -> None:
    store.hset(redis_keys.GATE.format(fleet=record.fleet), record.engine,
               json.dumps(record.to_dict()))  # fmt: skip


def fleet_records(store: redis.Redis, fleet: str) -> list[GateRecord]:
    """Every replica of ``fleet`` the gate has seen, by engine name."""
    raw = store.hgetall(redis_keys.GATE.format(fleet=fleet))
    records = [GateRecord.from_dict(json.loads(_text(v))) for v in raw.values()]
    return sorted(records, key=lambda r: r.engine)


def find(store: redis.Redis, fleets: list[str], replica: str) -> GateRecord | None:
    """The episode of ``replica`` (its engine name or its URL) in any of ``fleets``."""
    wanted = replica.rstrip("/")
    for fleet in fleets:
        for record in fleet_records(store, fleet):
            if wanted in (record.engine, record.url.rstrip("/")):
                return record
    return None


def claim(store: redis.Redis, fleet: str, engine: str, hold_s: float) -> bool:
    """Hold the replica for one look (False: another process holds it)."""
    key = redis_keys.GATE_LOOK.format(fleet=fleet, engine=engine)
    return bool(store.set(key, "1", nx=True, px=int(hold_s * 1000)))


def release(store: redis.Redis, fleet: str, engine: str) -> None:
    store.delete(redis_keys.GATE_LOOK.format(fleet=fleet, engine=engine))
