"""The Celery app: Redis broker and backend, JSON only, acks_late, one queue per kind of work.

Configuration is applied lazily on first use (``on_configure``), so importing this module
reads no environment and opens no connection.
"""

from __future__ import annotations

import contextlib
from typing import Any

from celery import Celery
from celery.signals import worker_process_shutdown
from kombu import Exchange, Queue

from tasks.adapters.broker_queues import PRIORITY_SEP, PRIORITY_STEPS
from tasks.settings import Settings, current_settings

QUEUES = ("ingest", "model", "warm", "events")
#: Message priorities (Redis: the lowest number is taken first). A warm-up a trigger asked for
#: (a replica that restarted, a router that forgot) goes ahead of the routine work queued on
#: the same queue: on a fleet of many replicas the window ticks queue up on ``ingest`` every
#: window, and a restarted replica's warm-up waited behind them.
#: (The broker's priority steps and lists: :mod:`tasks.adapters.broker_queues`.)
URGENT_PRIORITY, ROUTINE_PRIORITY = 0, 6
ROUTINE: dict[str, Any] = {"priority": ROUTINE_PRIORITY}

#: The one "warm now" task: (engine, reason or trigger kind), through the loop.
WARM_NOW = "prewarm.loop.warm"
#: how it is sent: ahead of the window ticks and ingests on its queue
WARM_NOW_OPTIONS: dict[str, Any] = {"priority": URGENT_PRIORITY}

#: Modules that define tasks; the worker imports them at start.
TASK_MODULES = [
    "tasks.health_tasks",
    "tasks.repo_tasks",
    "tasks.trigger_tasks",
    "tasks.warm_tasks",
    "tasks.ingest_tasks",
    "tasks.model_tasks",
    "tasks.loop_tasks",
]


def _queue(name: str) -> Queue:
    # Each queue gets its own direct exchange and routing key: with a shared default binding a
    # message routed to one queue would be copied into every queue bound to the same key.
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings derived from prewarm's settings."""
    return {
        "broker_url": settings.redis_url,
        "result_backend": settings.result_url or settings.redis_url,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_always_eager": False,
        "worker_prefetch_multiplier": 1,
        "task_track_started": True,
        "result_expires": 24 * 3600,
        "broker_connection_retry_on_startup": True,
        # Longer than the longest task (and a retry's countdown of three WAL leases), so an
        # unacked message is not redelivered while it runs; a plan whose worker died does not
        # wait for it: the recovery sweep resumes it after one lease (tasks.services.recovery).
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            "priority_steps": PRIORITY_STEPS,
            "sep": PRIORITY_SEP,
        },
        "result_backend_transport_options": {"visibility_timeout": settings.visibility_timeout_s},
        "task_queues": [_queue(name) for name in QUEUES],
        "task_default_queue": "events",
        # Priorities by route: they hold for every sender (by name, or with the task
        # registered: a task's own default would override the route's, so none is set).
        "task_routes": {
            WARM_NOW: {"queue": "ingest", **WARM_NOW_OPTIONS},
            **{f"prewarm.{name}.*": {"queue": name, **ROUTINE} for name in QUEUES},
            "prewarm.loop.*": {"queue": "ingest", **ROUTINE},  # the loop reads sources first
        },
        "timezone": "UTC",
        "enable_utc": True,
        "worker_hijack_root_logger": False,
        "beat_schedule": {},
    }


app = Celery("prewarm", include=TASK_MODULES)


def queue_warm_now(engine: str, reason: str) -> dict[str, Any]:
    """Queue the "warm now" task for ``engine`` and ``reason``, ahead of routine work; its
    task id."""
    return {"task_id": str(app.send_task(WARM_NOW, (engine, reason), **WARM_NOW_OPTIONS).id)}


@app.on_configure.connect
def _configure(sender: Celery, **_: Any) -> None:
    from tasks.adapters.connections import redact_logged_urls

    # Workers log at INFO, where httpx prints every engine request's URL with its password.
    redact_logged_urls()
    sender.conf.update(celery_config(current_settings()))


@worker_process_shutdown.connect
def _write_pending_metrics(**_: Any) -> None:
    """A pool process that exits writes its last batches' metrics (atexit may not run there)."""
    from tasks.adapters.telemetry import EXIT_WAIT_S, flush_batch_metrics

    with contextlib.suppress(Exception):  # a store gone at shutdown: nothing more to do
        flush_batch_metrics(EXIT_WAIT_S)
