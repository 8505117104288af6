"""``prewarm watch``: replica start-up and cold-cache triggers, polled in one loop, for a terminal.

The services do the same on beat (``prewarm.events.replica_watch``), through the same service
(:func:`tasks.services.replica_watch.watch_engine`); both keep the detectors' state and
cooldowns in the store Redis, so they never fire twice for one event. Every ``interval``
seconds each configured engine is observed (``/health``, ``/v1/models``, ``/metrics``). A
replica that became ready or restarted, or a cache gone cold (hit-rate drop, request spike),
is warmed at once by this process through the loop (the "warm now" service), whose plan the
workers run.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.console import Console

from tasks.adapters.store import Store, store_client
from tasks.services.fleets import look_at_fleets, router_restart_warms
from tasks.services.gate import Gatekeeper, leave_gated_start_ups
from tasks.services.loop import Submit
from tasks.services.replica_watch import WarmNow, warm_for_trigger, watch_engine
from tasks.settings import Settings, current_settings
from tasks.warm_tasks import submitter


class Watcher:
    """One polling loop over every configured engine; ``warm`` is what an event past its
    cooldown does (by default: warm now, in this process). The replicas of a gated fleet are
    the gate's (:class:`tasks.services.gate.Gatekeeper`, its plans sent with ``gate_submit``,
    by default to the workers): their start-up is not warmed again as a trigger."""

    def __init__(
        self, settings: Settings, store: Store, warm: WarmNow | None = None,
        gate_submit: Submit | None = None,
    ) -> None:  # fmt: skip
        self.configured, self.settings, self.store = settings, settings, store
        self.warm = warm or self._warm_here
        self.gate_submit = gate_submit

    def _warm_here(self, engine: str, kind: str) -> dict[str, Any]:
        return warm_for_trigger(self.settings, self.store, engine, kind, submitter(self.settings))

    def poll(self) -> list[dict[str, Any]]:
        """One look at every engine (each fleet's replicas as its router lists them now); what
        fired (and what warming it did)."""
        self.settings, changes = look_at_fleets(self.configured, self.store)
        gate = Gatekeeper(self.settings, self.store, self.gate_submit or submitter(self.settings))
        gated = {record.engine: record for record in gate.look()}
        warm = leave_gated_start_ups(self.warm, set(gated) | gate.gated_engines())
        fired = [
            event
            for engine in self.settings.engines
            for event in watch_engine(self.settings, self.store, engine, warm)
        ]
        warmed = {event["engine"] for event in fired}
        return fired + router_restart_warms(
            self.settings, self.store, changes, self.warm, time.time(), warmed
        )

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
