"""Health: every queue answers a ping, and the loop's periodic work is not failing."""

from __future__ import annotations

import os
import socket

from celery import shared_task

from tasks.base import PrewarmTask
from tasks.settings import current_settings


@shared_task(name="prewarm.events.ping", base=PrewarmTask)
def ping() -> dict[str, object]:
    """Answer with the worker's host and pid; used by health checks and tests."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def loop_health_problems() -> list[str]:
    """What makes the loop unhealthy now: periodic tasks whose last run failed, engines whose
    last tick failed (empty: healthy). An engine that is down is not a failure of prewarm."""
    from tasks.adapters.store import store_client
    from tasks.services.status import loop_problems

    settings = current_settings()
    return loop_problems(settings, store_client(settings))
