"""``prewarm watch``: replica start-up and cold-cache triggers, polled in one loop, for a terminal.

The services do the same on beat (``prewarm.events.replica_watch``); both keep the detectors'
state and cooldowns in the store Redis, so they never fire twice for one event. Every
``interval`` seconds each configured engine is observed (``/health``, ``/v1/models``,
``/metrics``). A replica that became ready or restarted is warmed at once through the loop; the
metrics feed a hit-rate-drop and a request-spike detector per engine, whose events (after a
cooldown) queue ``prewarm.events.warm_engine``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console

from pipeline.triggers import TriggerEvent
from tasks.adapters.cooldowns import TRIGGER_COOLDOWN_S
from tasks.adapters.store import Store, store_client
from tasks.services.replica_watch import detect_cold_cache, watch_replica
from tasks.settings import EngineSettings, Settings, current_settings
from tasks.trigger_tasks import queue_warm_engine
from tasks.warm_tasks import submitter

OnEvent = Callable[[TriggerEvent], Any]


class Watcher:
    """One polling loop over every configured engine."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        on_event: OnEvent | None = None,
        cooldown_s: float = TRIGGER_COOLDOWN_S,
    ) -> None:
        self.settings, self.store, self.cooldown_s = settings, store, cooldown_s
        self.on_event = on_event or (lambda event: queue_warm_engine(event.engine, event.kind))

    def poll_engine(self, engine: EngineSettings) -> list[dict[str, Any]]:
        """Observe one engine; returns what fired (replica warm-ups and trigger events)."""
        replica, sample = watch_replica(self.settings, self.store, engine, submitter(self.settings))
        fired = [replica] if replica else []
        if sample is None:
            return fired
        if replica:  # a replica that just started is warmed already; its cache is cold by nature
            return fired
        for event in detect_cold_cache(self.store, sample, self.cooldown_s):
            fired.append({**event.to_dict(), "task_id": self.on_event(event)})
        return fired

    def poll(self) -> list[dict[str, Any]]:
        """One pass over every engine."""
        return [f for engine in self.settings.engines for f in self.poll_engine(engine)]

    def run(self, interval_s: float, iterations: int | None = None) -> None:
        """Poll forever (or ``iterations`` times), ``interval_s`` apart."""
        done = 0
        while iterations is None or done < iterations:
            started = time.monotonic()
            for fired in self.poll():
                Console().print(fired, markup=False, highlight=False)
            done += 1
            time.sleep(max(0.0, interval_s - (time.monotonic() - started)))


def watch(
    interval: Annotated[
        float, typer.Option(help="Seconds between polls (default: schedule.replica_watch_s).")
    ] = 0.0,
    once: Annotated[bool, typer.Option(help="Poll once and exit.")] = False,
) -> None:
    """Watch engine replicas and cache metrics; warm what starts up or goes cold."""
    settings = current_settings()
    watcher = Watcher(settings, store_client(settings))
    watcher.run(interval or float(settings.schedule.replica_watch_s), 1 if once else None)


def register(app: typer.Typer) -> None:
    """Add ``prewarm watch``."""
    app.command("watch")(watch)
