"""Trigger tasks: the replica watch on beat and the after-ingest signals.

Each is a few lines that call one service (:mod:`tasks.services.replica_watch`,
:mod:`tasks.services.ingest_triggers`); every event they raise goes its one road: past its
cooldown to the "warm now" task (``prewarm.loop.warm``, :func:`tasks.celery_app.queue_warm_now`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from celery import shared_task

from tasks.adapters.store import store_client
from tasks.base import PrewarmTask
from tasks.celery_app import queue_warm_now
from tasks.services.fleets import fleet_settings, look_at_fleets, router_restart_warms
from tasks.services.gate import Gatekeeper, gated_engines, leave_gated_start_ups
from tasks.services.ingest_triggers import process_ingest
from tasks.services.replica_watch import watch_engine
from tasks.services.status import current_problems
from tasks.settings import current_settings
from tasks.warm_tasks import submitter


@shared_task(
    name="prewarm.events.replica_watch", base=PrewarmTask, periodic=True, ignore_result=True
)
def replica_watch() -> dict[str, Any]:
    """Look at every configured engine once (beat runs this every ``schedule.replica_watch_s``):
    a replica that started, or a cache gone cold, queues a warm-up; each fleet's router is
    asked for its replicas first (one it added is new here, and warmed), and a replica whose
    warm-up through a router failed while it was down is warmed again once it answers. The
    problems ``prewarm status`` shows, and their metrics, are brought up to date."""
    configured = current_settings()
    store = store_client(configured)
    settings, changes = look_at_fleets(configured, store)
    warm = leave_gated_start_ups(queue_warm_now, gated_engines(settings))
    fired = [f for engine in settings.engines for f in watch_engine(settings, store, engine, warm)]
    warmed = {event["engine"] for event in fired}
    now = time.time()
    fired += router_restart_warms(settings, store, changes, queue_warm_now, now, warmed)
    found = current_problems(configured, store, now)  # (and their metrics, every period)
    return {"engines": len(settings.engines), "warmed": fired, "problems": len(found)}


@shared_task(name="prewarm.events.gate_watch", base=PrewarmTask, periodic=True, ignore_result=True)
def gate_watch() -> dict[str, Any]:
    """One look of the gate at every gated fleet's replicas (beat runs this every
    ``schedule.gate_watch_s``): a replica that appeared or restarted is taken out of its
    router's list and its warm-up sent to the workers ahead of routine work; one whose warm-up
    is done and verified is added (:mod:`tasks.services.gate`)."""
    configured = current_settings()
    if not any(fleet.gate for fleet in configured.fleets):
        return {"gated": 0}
    store = store_client(configured)
    settings = fleet_settings(configured, store)
    records = Gatekeeper(settings, store, submitter(settings)).look()
    return {"gated": len(records), "states": {r.engine: r.state.value for r in records}}


@shared_task(name="prewarm.events.after_ingest", base=PrewarmTask)
def after_ingest(ingest_dir: str) -> dict[str, Any]:
    """Template hotness and cold-cache signals from one ingest output directory."""
    settings = current_settings()
    return process_ingest(settings, store_client(settings), Path(ingest_dir), warm=queue_warm_now)
