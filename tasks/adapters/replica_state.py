"""What the replica watch remembers between looks, in the store: each replica's last
observation and its cold-cache detectors' rolling state (JSON), so the beat task on any worker
and ``prewarm watch`` share what they saw."""

from __future__ import annotations

import json
from dataclasses import asdict

import redis

from pipeline.triggers import ReplicaObservation
from tasks.adapters import redis_keys


def last_observation(store: redis.Redis, engine: str) -> ReplicaObservation | None:
    """The replica's observation before this one (None: never observed)."""
    raw = store.get(redis_keys.REPLICA_LAST.format(engine=engine))
    if not raw:
        return None
    data = json.loads(raw)
    return ReplicaObservation(**{**data, "models": tuple(data["models"])})


def remember_observation(store: redis.Redis, current: ReplicaObservation) -> None:
    store.set(redis_keys.REPLICA_LAST.format(engine=current.engine), json.dumps(asdict(current)))


def detector_state(store: redis.Redis, engine: str) -> bytes | str | None:
    """The JSON of ``engine``'s cold-cache detectors (None: none yet)."""
    raw: bytes | str | None = store.get(redis_keys.TRIGGER_DETECTORS.format(engine=engine))
    return raw


def save_detector_state(store: redis.Redis, engine: str, state: str) -> None:
    store.set(redis_keys.TRIGGER_DETECTORS.format(engine=engine), state)
