"""Event tasks: a template repository changed, repositories polled, webhook deliveries claimed.

``prewarm.events.repo_changed`` is idempotent: it diffs from the last processed sha (not from
the payload's ``before``, once one is known), so a redelivered or replayed push finds nothing
left to do, and a push missed while the service was down is caught up by the next one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd
import redis
from celery import shared_task

from pipeline.errors import BadInputError, TransientError
from pipeline.template_diff import rewarm_set, template_hotness
from tasks.adapters import redis_keys
from tasks.adapters.template_repos import (
    TemplateRepo,
    check_sha,
    is_null_sha,
    last_sha,
    repo_config,
)
from tasks.celery_app import app
from tasks.rewarm import hotness, rewarm_repo, store_hotness
from tasks.settings import Settings, current_settings

DELIVERY_TTL_S = 7 * 24 * 3600
PUSH_LOCK_S = 600
_DELIVERY = redis_keys.WEBHOOK_DELIVERY
_LOCK = redis_keys.TEMPLATE_LOCK


@lru_cache(maxsize=4)
def _client(url: str) -> redis.Redis:
    # One connection pool per worker process and URL.
    return redis.Redis.from_url(url)


def store_client(settings: Settings | None = None) -> redis.Redis:
    """A client on prewarm's own Redis state."""
    return _client((settings or current_settings()).store_redis_url)


def claim_delivery(store: redis.Redis, forge: str, delivery: str, body: bytes) -> bool:
    """Claim a webhook delivery once; False when it was seen before (a replay or redelivery)."""
    ident = delivery or "body-" + hashlib.sha256(body).hexdigest()
    key = _DELIVERY.format(forge=forge, delivery=ident[:200])
    return bool(store.set(key, "1", nx=True, ex=DELIVERY_TTL_S))


def release_delivery(store: redis.Redis, forge: str, delivery: str, body: bytes) -> None:
    """Forget a claimed delivery (its task could not be queued, so the forge may retry)."""
    ident = delivery or "body-" + hashlib.sha256(body).hexdigest()
    store.delete(_DELIVERY.format(forge=forge, delivery=ident[:200]))


def process_push(
    settings: Settings, store: redis.Redis, name: str, before: str | None, after: str | None
) -> dict[str, Any]:
    """Sync ``name``, diff from the last processed sha to ``after`` and re-warm what changed.

    One push per repository at a time (a Redis lock): two pushes processed side by side could
    otherwise commit out of order and leave an older version serving.
    """
    repo = TemplateRepo(repo_config(settings, name), settings.data_dir)
    # The lock expires on its own if a worker dies holding it; a push takes seconds (the
    # benchmark's p99 is under 3 s for 100 templates), so 10 minutes is ample.
    lock = store.lock(_LOCK.format(repo=name), timeout=PUSH_LOCK_S, blocking_timeout=0)
    if not lock.acquire():
        raise TransientError(f"{name}: another push is being processed")
    try:
        return _process_locked(settings, store, repo, before, after)
    finally:
        lock.release()


def _process_locked(
    settings: Settings,
    store: redis.Redis,
    repo: TemplateRepo,
    before: str | None,
    after: str | None,
) -> dict[str, Any]:
    name = repo.config.name
    head = repo.sync()
    target = head if is_null_sha(after) else check_sha(after or "", "after")
    if not repo.has_commit(target):
        raise TransientError(f"{name}: commit {target} not fetched yet")
    base = last_sha(store, name) or (
        None if is_null_sha(before) else check_sha(before or "", "before")
    )
    if base is not None and repo.has_commit(base) and repo.is_ancestor(target, base):
        # Already processed, or an older push arriving late: never step back to it.
        return {"repo": name, "sha": target, "status": "up-to-date", "serving": base}
    changes, rejects = repo.changes(base, target)
    plan = rewarm_set(changes, hotness(store, name), rejects)
    record = rewarm_repo(settings, store, repo.config, target, plan)
    return {"repo": name, "sha": target, "base": base, "status": "committed", **_brief(record)}


def _brief(record: dict[str, Any]) -> dict[str, Any]:
    keep = ("warm", "retire", "changes", "rejects", "items", "retired_entries")
    return {key: record[key] for key in keep if key in record}


@shared_task(
    name="prewarm.events.repo_changed",
    acks_late=True,
    autoretry_for=(TransientError,),
    retry_backoff=True,
    retry_jitter=True,
    max_retries=5,
)
def repo_changed(repo: str, before: str | None = None, after: str | None = None) -> dict[str, Any]:
    """A push reached ``repo`` (from a webhook or a poll): re-warm its changed templates."""
    settings = current_settings()
    return process_push(settings, store_client(settings), repo, before, after)


def queue_repo_changed(
    repo: str, before: str | None, after: str | None, queue: str | None = None
) -> str:
    """Queue ``repo_changed`` on prewarm's app (not a thread's default app); returns the task id."""
    options = {"queue": queue} if queue else {}
    task = app.tasks["prewarm.events.repo_changed"]
    return str(task.apply_async((repo, before, after), **options).id)


def poll_changed(
    settings: Settings, store: redis.Redis, enqueue: Callable[[str, str | None, str], str]
) -> dict[str, Any]:
    """Fetch every configured repository; ``enqueue`` those whose head was not processed yet."""
    queued: dict[str, str] = {}
    failed: dict[str, str] = {}
    for config in settings.template_repos:
        try:
            head = TemplateRepo(config, settings.data_dir).sync()
        except TransientError as exc:  # one unreachable repository must not stop the others
            failed[config.name] = str(exc)
            continue
        if last_sha(store, config.name) != head:
            queued[config.name] = enqueue(config.name, None, head)
    return {"repos": len(settings.template_repos), "queued": queued, "failed": failed}


@shared_task(name="prewarm.events.poll_repos", acks_late=True)
def poll_repos() -> dict[str, Any]:
    """Poll the repositories (beat runs this every ``schedule.poll_repos_s``)."""
    settings = current_settings()
    return poll_changed(settings, store_client(settings), queue_repo_changed)


def _prompts(records_path: Path) -> pd.Series:
    if not records_path.exists():
        raise BadInputError("records file not found", where=str(records_path))
    frame = pd.read_parquet(records_path, columns=["prompt"])
    return frame["prompt"]


def update_hotness(
    settings: Settings, store: redis.Redis, repo: str, records_path: Path
) -> dict[str, Any]:
    """Count the requests of a records file per template of ``repo`` and store the counts."""
    mirror = TemplateRepo(repo_config(settings, repo), settings.data_dir)
    templates = mirror.templates_at(mirror.sync(), rejects=[])
    prompts = _prompts(records_path)
    counts = template_hotness(prompts, templates.values())
    store_hotness(store, repo, dict(counts))
    return {"repo": repo, "requests": len(prompts), "matched": sum(counts.values())}


@shared_task(name="prewarm.events.template_hotness", acks_late=True)
def template_hotness_task(repo: str, records_path: str) -> dict[str, Any]:
    """Match request prompts (a records Parquet file) to ``repo``'s templates by static prefix."""
    settings = current_settings()
    return update_hotness(settings, store_client(settings), repo, Path(records_path))
