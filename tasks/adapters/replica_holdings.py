"""What each replica was found holding when the plans that primed it were checked
(:mod:`tasks.services.holdings`), in the store: the item keys and when each was last seen held.
A replica that restarts holds nothing, and its record is cleared."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis

from tasks.adapters import redis_keys

#: a holding not confirmed again for this long is dropped (a replica's cache turns over)
HELD_KEEP_S = 86400.0


def update(
    store: redis.Redis, replica: str, held: Iterable[str], missing: Iterable[str], now: float
) -> None:
    """Record ``held`` as held at ``now`` and ``missing`` as gone, on ``replica``."""
    key = redis_keys.REPLICA_HELD.format(engine=replica)
    held, missing = list(held), list(missing)
    with store.pipeline() as pipe:
        if held:
            pipe.hset(key, mapping=dict.fromkeys(held, now))
        if missing:
            pipe.hdel(key, *missing)
        pipe.expire(key, int(HELD_KEEP_S))
        pipe.execute()


def clear(store: redis.Redis, replica: str) -> None:
    """The replica restarted: it holds nothing."""
    store.delete(redis_keys.REPLICA_HELD.format(engine=replica))


def summary(store: redis.Redis, replica: str) -> dict[str, Any]:
    """How many items the replica was found holding, and when it was last checked."""
    seen = [float(v) for v in store.hvals(redis_keys.REPLICA_HELD.format(engine=replica))]
    return {"items": len(seen), "checked_at": max(seen) if seen else None}
