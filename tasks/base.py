"""One base class for prewarm's tasks: the retry, time-limit and health policy in one place.

A task declares only what differs (``@shared_task(name=..., base=PrewarmTask, periodic=True)``)
and stays a few lines that call one service. The policy, as Dramatiq's actor options:

* ``acks_late`` and rejection on a lost worker: a message is acknowledged only once done;
* transient errors (:class:`~pipeline.errors.TransientError`, a Redis connection or timeout
  error) are retried with exponential backoff and jitter, at most ``max_retries`` times; bad
  input is never retried;
* a soft time limit below the hard one, both below the broker's visibility timeout;
* ``periodic = True`` (the tasks beat sends): each run's success or failure is recorded in the
  store (:data:`tasks.adapters.redis_keys.TASK_HEALTH`), so a service whose periodic work fails is
  reported unhealthy (``prewarm health beat``, ``prewarm status``) instead of staying green.
"""

from __future__ import annotations

from typing import Any

from celery import Task

from pipeline.errors import TransientError
from tasks.adapters.store import STORE_DOWN
from tasks.adapters.task_health import record_task_health


class PrewarmTask(Task):
    """prewarm's task policy; see the module docstring."""

    acks_late = True
    reject_on_worker_lost = True
    autoretry_for = (TransientError, *STORE_DOWN)
    retry_backoff = True
    retry_backoff_max = 120
    retry_jitter = True
    max_retries = 5
    soft_time_limit = 900
    time_limit = 960
    #: record each run's outcome for health (the tasks beat sends)
    periodic = False

    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        if self.periodic:
            record_task_health(self.name, ok=True)

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        if self.periodic:
            record_task_health(self.name, ok=False, error=f"{type(exc).__name__}: {exc}")
