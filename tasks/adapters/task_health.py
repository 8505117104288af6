"""Each periodic task's last success and failure in the store (``prewarm health``, status)."""

from __future__ import annotations

import logging
import time

import redis

from tasks.adapters import redis_keys
from tasks.adapters.store import store_client

log = logging.getLogger(__name__)


def record_task_health(
    name: str,
    *,
    ok: bool,
    error: str = "",
    now: float | None = None,
    store: redis.Redis | None = None,
) -> None:
    """Note that the periodic task ``name`` succeeded or failed now."""
    now = time.time() if now is None else now
    fields: dict[str, str] = (
        {f"{name}:ok": str(now)}
        if ok
        else {f"{name}:failed": str(now), f"{name}:error": error[:500]}
    )
    try:
        with (store or store_client()).pipeline(transaction=True) as pipe:
            for field, value in fields.items():
                pipe.hset(redis_keys.TASK_HEALTH, field, value)
            pipe.execute()
    except (redis.ConnectionError, redis.TimeoutError) as exc:  # the health check reports Redis
        log.warning("task health of %s not recorded: %s", name, exc)


def failing_tasks(store: redis.Redis) -> dict[str, str]:
    """Periodic tasks whose latest run failed: task name → the error."""
    raw = {_text(k): _text(v) for k, v in store.hgetall(redis_keys.TASK_HEALTH).items()}
    failing = {}
    for field, value in raw.items():
        if field.endswith(":failed"):
            name = field[: -len(":failed")]
            if float(value) > float(raw.get(f"{name}:ok", 0)):
                failing[name] = raw.get(f"{name}:error", "")
    return failing


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
