"""A template repository changed: sync it, diff from the last processed sha, re-warm what
changed (:mod:`tasks.services.rewarm`); poll every repository; per-template hotness.

Idempotent: a push diffs from the last processed sha (not from the payload's ``before``, once
one is known), so a redelivered or replayed push finds nothing left to do, and a push missed
while the service was down is caught up by the next one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.errors import BadInputError, TransientError
from pipeline.template_diff import rewarm_set, template_hotness
from tasks.adapters.store import Store
from tasks.adapters.template_repos import (
    TemplateRepo,
    check_sha,
    is_null_sha,
    last_sha,
    push_lock,
    repo_config,
)
from tasks.adapters.template_serving import hotness, store_hotness
from tasks.services.rewarm import rewarm_repo
from tasks.settings import Settings


def process_push(
    settings: Settings, store: Store, name: str, before: str | None, after: str | None
) -> dict[str, Any]:
    """Sync ``name``, diff from the last processed sha to ``after`` and re-warm what changed.

    One push per repository at a time (a Redis lock): two pushes processed side by side could
    otherwise commit out of order and leave an older version serving.
    """
    repo = TemplateRepo(repo_config(settings, name), settings.host_dir)
    # The lock expires on its own if a worker dies holding it; a push takes seconds (the
    # benchmark's p99 is under 3 s for 100 templates), so 10 minutes is ample.
    lock = push_lock(store, name)
    if not lock.acquire():
        raise TransientError(f"{name}: another push is being processed")
    try:
        return _process_locked(settings, store, repo, before, after)
    finally:
        lock.release()


def _process_locked(
    settings: Settings,
    store: Store,
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
    keep = ("warm", "retire", "changes", "rejects", "items")
    return {key: record[key] for key in keep if key in record}


def poll_changed(
    settings: Settings, store: Store, enqueue: Callable[[str, str | None, str], str]
) -> dict[str, Any]:
    """Fetch every configured repository; ``enqueue`` those whose head was not processed yet."""
    queued: dict[str, str] = {}
    failed: dict[str, str] = {}
    for config in settings.template_repos:
        try:
            head = TemplateRepo(config, settings.host_dir).sync()
        except TransientError as exc:  # one unreachable repository must not stop the others
            failed[config.name] = str(exc)
            continue
        if last_sha(store, config.name) != head:
            queued[config.name] = enqueue(config.name, None, head)
    return {"repos": len(settings.template_repos), "queued": queued, "failed": failed}


def _prompts(records_path: Path) -> pd.Series:
    if not records_path.exists():
        raise BadInputError("records file not found", where=str(records_path))
    frame = pd.read_parquet(records_path, columns=["prompt"])
    return frame["prompt"]


def update_hotness(
    settings: Settings, store: Store, repo: str, records_path: Path
) -> dict[str, Any]:
    """Count the requests of a records file per template of ``repo`` and store the counts."""
    mirror = TemplateRepo(repo_config(settings, repo), settings.host_dir)
    templates = mirror.templates_at(mirror.sync(), rejects=[])
    prompts = _prompts(records_path)
    counts = template_hotness(prompts, templates.values())
    store_hotness(store, repo, dict(counts))
    return {"repo": repo, "requests": len(prompts), "matched": sum(counts.values())}
