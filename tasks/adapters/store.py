"""The store client: one Redis connection pool per process and URL on prewarm's own state.

Everything above the adapters names the client by :data:`Store` and catches
:data:`STORE_DOWN` (the store cannot be reached) or :data:`StoreError` (any store failure),
so no module outside :mod:`tasks.adapters` imports the Redis client library.
"""

from __future__ import annotations

from functools import lru_cache

import redis

from tasks.settings import Settings, current_settings

#: A client on the store (prewarm's own Redis state).
Store = redis.Redis
#: Any error of the store.
StoreError = redis.RedisError
#: The store cannot be reached right now (worth a retry).
STORE_DOWN: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)


@lru_cache(maxsize=4)
def _client(url: str) -> redis.Redis:
    # One connection pool per worker process and URL, built on first use, never at import.
    return redis.Redis.from_url(url)


def probe_client(url: str, connect_s: float = 1.0, read_s: float = 1.0) -> redis.Redis:
    """A client of its own with short timeouts, for a scrape or a health probe that must answer
    quickly (a Redis down is a gauge of 0, not a hang)."""
    return redis.Redis.from_url(url, socket_connect_timeout=connect_s, socket_timeout=read_s)


def broker_client(settings: Settings | None = None) -> redis.Redis:
    """A client on the Celery broker's Redis (the recovery sweep reads its queues)."""
    return _client((settings or current_settings()).redis_url)


def store_client(settings: Settings | None = None) -> redis.Redis:
    """A client on prewarm's own Redis state (the same one for a process and URL)."""
    return _client((settings or current_settings()).store_redis_url)
