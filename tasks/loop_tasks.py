"""The loop's tasks (queue ``ingest``): a dispatcher on beat and one tick per engine and window.

``prewarm.loop.dispatch`` runs every few seconds on beat. It reads the settings again when
their file changed, so an engine added to the file gets its first tick at once and its next
ones every ``schedule.window_s``, with no process restarted; an engine whose tick is due gets
``prewarm.loop.tick(engine, window)``. A tick runs once per engine and window, whichever
worker takes it (a claim in the store), so two dispatchers or a redelivery do no harm.
"""

from __future__ import annotations

import time
from typing import Any

from celery import shared_task

from tasks.adapters.loop_state import LoopState
from tasks.adapters.store import store_client
from tasks.base import PrewarmTask
from tasks.celery_app import WARM_NOW, app
from tasks.services.fleets import fleet_settings
from tasks.services.loop import WarmLoop, window_start
from tasks.services.replica_watch import warm_for_trigger
from tasks.settings import current_settings
from tasks.warm_tasks import submitter


def due_engines(now: float) -> list[tuple[str, float]]:
    """Engines whose window tick is due at ``now``, with the window it is for; each one's next
    tick is set to the following window, so it is sent once."""
    store = store_client(current_settings())
    settings = fleet_settings(current_settings(), store)
    state = LoopState(store)
    window_s = settings.schedule.window_s
    due = []
    for engine in settings.engines:
        next_tick = state.next_tick(engine.name)
        if next_tick is None or next_tick <= now:
            start = window_start(now, window_s)
            state.set_next_tick(engine.name, start + window_s)
            due.append((engine.name, start))
    return due


@shared_task(name="prewarm.loop.dispatch", base=PrewarmTask, periodic=True, ignore_result=True)
def dispatch() -> dict[str, Any]:
    """Send the window tick of every engine that is due."""
    sent = {}
    for engine, start in due_engines(time.time()):
        sent[engine] = app.tasks["prewarm.loop.tick"].apply_async((engine, start)).id
    return {"ticks": sent}


@shared_task(name="prewarm.loop.tick", base=PrewarmTask, periodic=True)
def tick(engine: str, window: float) -> dict[str, Any] | None:
    """The window tick of ``engine`` for the window starting at ``window`` (Unix seconds)."""
    store = store_client(current_settings())
    settings = fleet_settings(current_settings(), store)
    return WarmLoop(settings, store, submitter(settings)).tick(engine, now=window)


@shared_task(name=WARM_NOW, base=PrewarmTask)
def warm(engine: str, reason: str) -> dict[str, Any]:
    """The one "warm now" task: warm ``engine`` through the loop for ``reason`` (a plan reason
    such as ``demo`` or ``cli``, or a trigger kind: ``replica_restarted``, ``hit_rate_drop`` …)."""
    store = store_client(current_settings())
    settings = fleet_settings(current_settings(), store)
    return warm_for_trigger(settings, store, engine, reason, submitter(settings))
