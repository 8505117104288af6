"""What prewarm remembers of each fleet between looks, in the store: the replicas its router
listed (for fleets that take them from the router) and what it last saw of the router."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import redis

from tasks.adapters import redis_keys


def members(store: redis.Redis, fleets: Iterable[str]) -> dict[str, list[str]]:
    """The replica URLs each fleet's router listed at the last look (absent: never looked)."""
    names = list(fleets)
    if not names:
        return {}
    raws = store.mget([redis_keys.FLEET_MEMBERS.format(fleet=f) for f in names])
    return {f: json.loads(raw) for f, raw in zip(names, raws, strict=True) if raw}


def save_members(store: redis.Redis, fleet: str, urls: list[str]) -> None:
    store.set(redis_keys.FLEET_MEMBERS.format(fleet=fleet), json.dumps(sorted(urls)))


#: how long a warm-up's request id is remembered (its replica's log is read well before)
SENT_KEEP_S = 86400.0


def remember_sent(store: redis.Redis, request_ids: Iterable[str], now: float) -> None:
    """Remember the engine request ids of warm-ups sent through a router (older ones go)."""
    ids = {rid: now for rid in request_ids if rid}
    if not ids:
        return
    with store.pipeline(transaction=False) as pipe:
        pipe.zadd(redis_keys.FLEET_SENT, ids)
        pipe.zremrangebyscore(redis_keys.FLEET_SENT, "-inf", now - SENT_KEEP_S)
        pipe.execute()


def sent_ids(store: redis.Redis) -> frozenset[str]:
    """The engine request ids of warm-ups sent through a router, remembered."""
    raw = store.zrange(redis_keys.FLEET_SENT, 0, -1)
    return frozenset(r.decode() if isinstance(r, bytes) else str(r) for r in raw)


def router_seen(store: redis.Redis, fleet: str) -> dict[str, Any] | None:
    """What the last look at ``fleet``'s router saw (None: never looked)."""
    raw = store.get(redis_keys.FLEET_ROUTER.format(fleet=fleet))
    return json.loads(raw) if raw else None


def save_router_seen(store: redis.Redis, fleet: str, seen: dict[str, Any]) -> None:
    store.set(redis_keys.FLEET_ROUTER.format(fleet=fleet), json.dumps(seen))


def remember_road_failed(
    store: redis.Redis, fleet: str, engine: str, plan_id: str, now: float
) -> None:
    """Remember that ``engine``'s warm-up (plan ``plan_id``) through ``fleet``'s router failed
    while the router did not answer: it is owed a warm-up once the router answers."""
    key = redis_keys.FLEET_ROAD_FAILED.format(fleet=fleet)
    store.hset(key, engine, json.dumps({"ts": now, "plan": plan_id}))


def road_failed(store: redis.Redis, fleet: str) -> dict[str, dict[str, Any]]:
    """The replicas of ``fleet`` owed a warm-up through its router (engine -> {ts, plan})."""
    raw = store.hgetall(redis_keys.FLEET_ROAD_FAILED.format(fleet=fleet))
    return {(k.decode() if isinstance(k, bytes) else str(k)): json.loads(v) for k, v in raw.items()}


def take_road_failed(store: redis.Redis, fleet: str, engines: Iterable[str]) -> list[str]:
    """Take ``engines``' owed warm-ups out of ``fleet``'s list, at once (two watchers cannot
    both take one); returns the engines that had one."""
    names = list(engines)
    if not names:
        return []
    key = redis_keys.FLEET_ROAD_FAILED.format(fleet=fleet)
    with store.pipeline(transaction=True) as pipe:
        pipe.hmget(key, names)
        pipe.hdel(key, *names)
        owed, _ = pipe.execute()
    return [name for name, raw in zip(names, owed, strict=True) if raw]
