"""Template repository tasks: a repository changed (webhook or poll), poll them all, hotness.

``prewarm.events.repo_changed`` is idempotent (:mod:`tasks.services.repo_events`): a
redelivered or replayed push finds nothing left to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import shared_task

from tasks.adapters.store import store_client
from tasks.base import PrewarmTask
from tasks.celery_app import app
from tasks.services.repo_events import poll_changed, process_push, update_hotness
from tasks.settings import current_settings


@shared_task(name="prewarm.events.repo_changed", base=PrewarmTask)
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


@shared_task(name="prewarm.events.poll_repos", base=PrewarmTask, periodic=True)
def poll_repos() -> dict[str, Any]:
    """Poll the repositories (beat runs this every ``schedule.poll_repos_s``)."""
    settings = current_settings()
    return poll_changed(settings, store_client(settings), queue_repo_changed)


@shared_task(name="prewarm.events.template_hotness", base=PrewarmTask)
def template_hotness_task(repo: str, records_path: str) -> dict[str, Any]:
    """Match request prompts (a records Parquet file) to ``repo``'s templates by static prefix."""
    settings = current_settings()
    return update_hotness(settings, store_client(settings), repo, Path(records_path))
