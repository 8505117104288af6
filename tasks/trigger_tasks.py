"""Trigger tasks: the replica watch on beat, "warm this engine now", and the after-ingest signals.

Each is a few lines that call one service (:mod:`tasks.services.replica_watch`,
:mod:`tasks.services.ingest_triggers`) with the store client and the Celery submitters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import shared_task

from tasks.adapters.store import store_client
from tasks.base import PrewarmTask
from tasks.celery_app import app
from tasks.services.ingest_triggers import process_ingest
from tasks.services.replica_watch import warm_replica, watch_engine
from tasks.settings import current_settings
from tasks.warm_tasks import submitter


@shared_task(
    name="prewarm.events.replica_watch", base=PrewarmTask, periodic=True, ignore_result=True
)
def replica_watch() -> dict[str, Any]:
    """Poll every configured engine once (beat runs this every ``schedule.replica_watch_s``):
    replicas that started are warmed, cold-cache triggers queue a warm-up."""
    settings = current_settings()
    store, submit = store_client(settings), submitter(settings)
    fired = [
        f
        for engine in settings.engines
        for f in watch_engine(settings, store, engine, submit=submit, enqueue=queue_warm_engine)
    ]
    return {"engines": len(settings.engines), "warmed": fired}


@shared_task(name="prewarm.events.warm_engine", base=PrewarmTask)
def warm_engine(engine: str, reason: str) -> dict[str, Any]:
    """Warm ``engine`` now (a cold-cache trigger fired for it)."""
    settings = current_settings()
    return warm_replica(
        settings, store_client(settings), settings.engine(engine), reason, submitter(settings)
    )


def queue_warm_engine(engine: str, reason: str) -> str:
    """Queue ``warm_engine`` on prewarm's app; returns the task id."""
    return str(app.tasks["prewarm.events.warm_engine"].apply_async((engine, reason)).id)


@shared_task(name="prewarm.events.after_ingest", base=PrewarmTask)
def after_ingest(ingest_dir: str) -> dict[str, Any]:
    """Template hotness and cold-cache signals from one ingest output directory."""
    settings = current_settings()
    return process_ingest(
        settings, store_client(settings), Path(ingest_dir), enqueue=queue_warm_engine
    )
