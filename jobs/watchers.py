"""``prewarm watch``: replica start-up and cold-cache triggers, polled in one loop.

Every ``interval`` seconds each configured engine is observed (``/health``, ``/v1/models``,
``/metrics``). A replica that became ready or restarted is warmed at once; the metrics feed a
hit-rate-drop detector and a request-spike detector per engine, whose events (after a cooldown
held in Redis) queue ``prewarm.events.warm_engine``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import redis
import typer
from rich.console import Console

from pipeline.triggers import (
    EngineSample,
    HitRateDropDetector,
    SpikeDetector,
    TriggerEvent,
    counter_delta,
)
from tasks.engine_watch import cooldown_allows, queue_warm_engine, watch_replica
from tasks.events import store_client
from tasks.settings import EngineSettings, Settings, current_settings

TRIGGER_COOLDOWN_S = 300.0
OnEvent = Callable[[TriggerEvent], Any]


@dataclass
class EngineDetectors:
    """Rolling state of one engine's cold-cache detectors."""

    hit_rate: HitRateDropDetector = field(default_factory=HitRateDropDetector)
    spike: SpikeDetector = field(default_factory=SpikeDetector)
    previous: EngineSample | None = None

    def observe(self, sample: EngineSample) -> list[TriggerEvent]:
        """Feed one scrape; returns the events it raised."""
        events = [self.hit_rate.observe(sample)]
        if self.previous is not None:
            requests = counter_delta(self.previous.requests, sample.requests)
            if requests is not None:
                events.append(self.spike.observe(sample.engine, sample.ts, requests))
        self.previous = sample
        return [event for event in events if event is not None]


class Watcher:
    """One polling loop over every configured engine."""

    def __init__(
        self,
        settings: Settings,
        store: redis.Redis,
        on_event: OnEvent | None = None,
        cooldown_s: float = TRIGGER_COOLDOWN_S,
    ) -> None:
        self.settings, self.store, self.cooldown_s = settings, store, cooldown_s
        self.on_event = on_event or (lambda event: queue_warm_engine(event.engine, event.kind))
        self.detectors: dict[str, EngineDetectors] = {}

    def poll_engine(self, engine: EngineSettings) -> list[dict[str, Any]]:
        """Observe one engine; returns what fired (replica warm-ups and trigger events)."""
        replica, sample = watch_replica(self.settings, self.store, engine)
        fired = [replica] if replica else []
        if sample is None:
            return fired
        detectors = self.detectors.setdefault(engine.name, EngineDetectors())
        for event in detectors.observe(sample):
            if cooldown_allows(self.store, event, self.cooldown_s):
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
