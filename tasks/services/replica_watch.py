"""Watching engine replicas: a replica that became ready or restarted is warmed at once through
the loop (:meth:`tasks.services.loop.WarmLoop.warm_now`, reason ``replica``): what the window
tick would warm (the forecast's hottest prefixes within its capacity) plus its workload shapes
and adapters. The same scrape feeds the cold-cache detectors (hit-rate drop, request spike);
an event past its cooldown (:mod:`tasks.adapters.cooldowns`) is handed to ``enqueue``, the one
"warm now" task. What a look sees comes from :mod:`tasks.adapters.engine_probe`; what the
watch remembers between looks lives in the store (:mod:`tasks.adapters.replica_state`).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.planner.reasons import PlanReason
from pipeline.triggers import (
    EngineSample,
    HitRateDropDetector,
    SpikeDetector,
    TriggerEvent,
    counter_delta,
    replica_event,
)
from tasks.adapters import replica_state
from tasks.adapters.cooldowns import REPLICA_COOLDOWN_S, TRIGGER_COOLDOWN_S, cooldown_allows
from tasks.adapters.engine_probe import observe
from tasks.adapters.store import Store
from tasks.adapters.telemetry import record_engine_sample
from tasks.services.loop import Submit, WarmLoop
from tasks.settings import EngineSettings, Settings

#: Queues the "warm now" task: (engine name, trigger kind) → task id.
Enqueue = Callable[[str, str], str]


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


def detect_cold_cache(
    store: Store, sample: EngineSample, cooldown_s: float = TRIGGER_COOLDOWN_S
) -> list[TriggerEvent]:
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
    return [e for e in events if cooldown_allows(store, e, cooldown_s)]


def warm_replica(
    settings: Settings, store: Store, engine: EngineSettings, reason: str, submit: Submit
) -> dict[str, Any]:
    """Warm ``engine`` through the loop now; ``reason`` is a trigger kind (``replica_ready``,
    ``replica_restarted``, ``hit_rate_drop`` …). Returns the outcome (its plan id and size)."""
    plan_reason = PlanReason.REPLICA if reason.startswith("replica") else PlanReason.TRIGGER
    outcome = WarmLoop(settings, store, submit).warm_now(engine.name, plan_reason)
    return {"engine": engine.name, "reason": reason, "items": outcome["planned"],
            "plan_id": outcome["plan_id"], "status": outcome["status"]}  # fmt: skip


def watch_replica(
    settings: Settings, store: Store, engine: EngineSettings, submit: Submit
) -> tuple[dict[str, Any] | None, EngineSample | None]:
    """Observe one replica, remember it, and warm it if it became ready or restarted.

    Returns what was warmed (or None) and the metrics sample, for the cold-cache detectors.
    """
    current, sample = observe(engine)
    record_engine_sample(store, engine.name, sample)
    previous = replica_state.last_observation(store, engine.name)
    replica_state.remember_observation(store, current)
    event = replica_event(previous, current)
    if event is None or not cooldown_allows(store, event, REPLICA_COOLDOWN_S):
        return None, sample
    return {**event.to_dict(), **warm_replica(settings, store, engine, event.kind, submit)}, sample


def watch_engine(
    settings: Settings,
    store: Store,
    engine: EngineSettings,
    *,
    submit: Submit,
    enqueue: Enqueue,
    cooldown_s: float = TRIGGER_COOLDOWN_S,
) -> list[dict[str, Any]]:
    """One look at ``engine``: warm a replica that started (through ``submit``), and hand
    cold-cache triggers past their cooldown to ``enqueue`` (the "warm now" task)."""
    replica, sample = watch_replica(settings, store, engine, submit)
    fired = [replica] if replica else []
    if sample is not None:
        for event in detect_cold_cache(store, sample, cooldown_s) if not replica else ():
            fired.append({**event.to_dict(), "task_id": enqueue(event.engine, event.kind)})
    return fired
