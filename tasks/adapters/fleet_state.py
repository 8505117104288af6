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


def router_seen(store: redis.Redis, fleet: str) -> dict[str, Any] | None:
    """What the last look at ``fleet``'s router saw (None: never looked)."""
    raw = store.get(redis_keys.FLEET_ROUTER.format(fleet=fleet))
    return json.loads(raw) if raw else None


def save_router_seen(store: redis.Redis, fleet: str, seen: dict[str, Any]) -> None:
    store.set(redis_keys.FLEET_ROUTER.format(fleet=fleet), json.dumps(seen))
