"""Tasks that prove the cluster is alive: every queue answers a ping."""

from __future__ import annotations

import os
import socket

from celery import shared_task


@shared_task(name="prewarm.events.ping", acks_late=True)
def ping() -> dict[str, object]:
    """Answer with the worker's host and pid; used by health checks and tests."""
    return {"host": socket.gethostname(), "pid": os.getpid()}
