"""Watching engine replicas, and the one road of every trigger: event → cooldown
(:mod:`tasks.adapters.cooldowns`) → "warm now" with its reason.

A look at a replica (:mod:`tasks.adapters.engine_probe`) raises ``replica_ready`` or
``replica_restarted`` when it became ready or restarted; otherwise the same scrape feeds the
cold-cache detectors (hit-rate drop, request spike). Each event past its cooldown is handed to
``warm`` — on beat, the "warm now" task (``prewarm.loop.warm``); in a terminal
(``prewarm watch``), :func:`warm_for_trigger` in that process — and both end in the loop
(:meth:`tasks.services.loop.WarmLoop.warm_now`) with the trigger's plan reason: a replica gets
what the window tick would warm (the forecast's hottest prefixes within its capacity) plus its
workload shapes and adapters. What the watch remembers between looks lives in the store
(:mod:`tasks.adapters.replica_state`).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.fleet_roads import ROUTER_RESTARTED, through_router
from pipeline.planner.plan import WarmPlan
from pipeline.planner.reasons import trigger_reason
from pipeline.triggers import (
    EngineSample,
    HitRateDropDetector,
    ReplicaObservation,
    SpikeDetector,
    TriggerEvent,
    counter_delta,
    replica_event,
)
from tasks.adapters import replica_holdings, replica_state
from tasks.adapters.cooldowns import cooldown_allows
from tasks.adapters.engine_probe import observe
from tasks.adapters.store import Store
from tasks.adapters.telemetry import record_engine_sample
from tasks.services.loop import Submit, WarmLoop
from tasks.settings import EngineSettings, Settings

#: "Warm now": (engine name, trigger kind) → what was done (the queued task's id, or the
#: warm-up's outcome where it ran in this process).
WarmNow = Callable[[str, str], dict[str, Any]]


@dataclass
class EngineDetectors:
    """Rolling state of one engine's cold-cache detectors (kept in the store between scrapes)."""

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

    def to_json(self) -> str:
        def sample(s: EngineSample | None) -> dict[str, Any] | None:
            return None if s is None else asdict(s)

        return json.dumps({
            "baseline": self.hit_rate.baseline, "hit_previous": sample(self.hit_rate.previous),
            "spike_history": list(self.spike.history), "previous": sample(self.previous),
        })  # fmt: skip

    @classmethod
    def from_json(cls, raw: bytes | str | None) -> EngineDetectors:
        detectors = cls()
        if not raw:
            return detectors
        data = json.loads(raw)
        detectors.hit_rate.baseline = data["baseline"]
        detectors.hit_rate.previous = _sample(data["hit_previous"])
        detectors.spike.history = deque(
            data["spike_history"], maxlen=detectors.spike.history.maxlen
        )
        detectors.previous = _sample(data["previous"])
        return detectors


def _sample(data: dict[str, Any] | None) -> EngineSample | None:
    if data is None:
        return None
    buckets = tuple((float(le), float(n)) for le, n in data.pop("ttft_buckets", ()))
    return EngineSample(**data, ttft_buckets=buckets)


def detect_cold_cache(store: Store, sample: EngineSample) -> list[TriggerEvent]:
    """Feed one scrape to the engine's detectors (state in the store); the events that fired
    past their cooldown."""
    detectors = EngineDetectors.from_json(replica_state.detector_state(store, sample.engine))
    previous = detectors.previous
    if previous is not None and previous.start_time != sample.start_time:
        # A new engine process: its counters and its cache start from zero, and the replica
        # watch warms it; a "drop" measured across the restart would only warm it twice.
        detectors = EngineDetectors()
    events = detectors.observe(sample)
    replica_state.save_detector_state(store, sample.engine, detectors.to_json())
    return [e for e in events if cooldown_allows(store, e)]


def warm_for_trigger(
    settings: Settings, store: Store, engine: str, kind: str, submit: Submit
) -> dict[str, Any]:
    """The "warm now" service: warm ``engine`` through the loop for a trigger ``kind``
    (``replica_ready``, ``hit_rate_drop`` …, or a plan reason), with its plan reason. Returns
    the loop's outcome, with the trigger and the plan's size (``items``). A router's restart
    (:data:`ROUTER_RESTARTED`) is answered through the router, whatever its policy's road."""
    if kind == ROUTER_RESTARTED:
        submit = _through_router(submit)
    outcome = WarmLoop(settings, store, submit).warm_now(engine, trigger_reason(kind))
    return {**outcome, "trigger": kind, "items": outcome["planned"]}


def _through_router(submit: Submit) -> Submit:
    def routed(plan: WarmPlan, engine: str) -> str:
        return submit(through_router(plan), engine)

    return routed


def _new_process(previous: ReplicaObservation | None, current: ReplicaObservation) -> bool:
    """Whether ``current`` is another engine process than the last one seen (a replica that
    only missed a look under load keeps its cache)."""
    if previous is None or previous.start_time is None or current.start_time is None:
        return True
    return previous.start_time != current.start_time


def watch_engine(
    settings: Settings, store: Store, engine: EngineSettings, warm: WarmNow
) -> list[dict[str, Any]]:
    """One look at ``engine``: a replica that became ready or restarted, else the cold-cache
    triggers of its metrics; each event past its cooldown goes to ``warm``. Returns what
    fired, with what ``warm`` did."""
    current, sample = observe(engine)
    record_engine_sample(store, engine.name, sample)
    previous = replica_state.last_observation(store, engine.name)
    replica_state.remember_observation(store, current)
    replica = replica_event(previous, current)
    if replica is not None and _new_process(previous, current):  # it holds nothing
        replica_holdings.clear(store, engine.name)
    if replica is not None and cooldown_allows(store, replica):
        # a replica that just started is warmed; its cache is cold by nature, not a trigger
        return [{**replica.to_dict(), **warm(engine.name, replica.kind)}]
    events = detect_cold_cache(store, sample) if sample is not None else []
    return [{**event.to_dict(), **warm(event.engine, event.kind)} for event in events]
