"""Beat schedule from configuration (``[schedule]``): what runs periodically, and how often.

The warm-up loop's dispatcher (``prewarm.loop.dispatch``) runs every :data:`DISPATCH_S`
seconds (or every window, when windows are shorter) and sends each engine's window tick when
it is due, so windows, engines and sources changed in the settings file apply at the next tick
without restarting beat. Retraining reads the same observations (``prewarm.model.
retrain_engines``, every ``retrain_s``).

``prewarm beat`` (``jobs.cmd_services``) installs :func:`beat_schedule`. Each entry expires after
one period, so a beat that was down does not flood the workers with stale ticks when it returns.
Entries whose task no installed module defines are left out (and named in the log), so the
schedule never sends a message no worker can run.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from tasks.celery_app import TASK_MODULES, app
from tasks.settings import Settings

logger = logging.getLogger(__name__)

#: Seconds between two looks of the loop's dispatcher at the engines' next ticks.
DISPATCH_S = 5.0

#: (entry name, task name, the ``schedule`` setting that gives its period)
PERIODIC = (
    ("warm-loop", "prewarm.loop.dispatch", "window_s"),
    ("retrain", "prewarm.model.retrain_engines", "retrain_s"),
    ("poll-template-repos", "prewarm.events.poll_repos", "poll_repos_s"),
    ("wal-recovery-sweep", "prewarm.warm.recover", "wal_sweep_s"),
    ("replica-watch", "prewarm.events.replica_watch", "replica_watch_s"),
    ("gate-watch", "prewarm.events.gate_watch", "gate_watch_s"),
)


def known_tasks() -> set[str]:
    """Names of every task the worker modules define."""
    for module in TASK_MODULES:
        importlib.import_module(module)
    return {name for name in app.tasks if name.startswith("prewarm.")}


def beat_schedule(settings: Settings, known: set[str] | None = None) -> dict[str, dict[str, Any]]:
    """The beat schedule for ``settings``: one entry per periodic task that exists."""
    known = known_tasks() if known is None else known
    schedule: dict[str, dict[str, Any]] = {}
    for entry, task, setting in PERIODIC:
        if task not in known:
            logger.info("beat: %s left out (no task %s installed)", entry, task)
            continue
        period = float(getattr(settings.schedule, setting))
        if entry == "warm-loop":
            period = min(period, DISPATCH_S)
        schedule[entry] = {"task": task, "schedule": period, "options": {"expires": period}}
    return schedule
