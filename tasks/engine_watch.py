"""Watching engine replicas: health, served models, process start time and cache metrics.

A replica that becomes ready or restarts is warmed at once through the loop
(:meth:`tasks.loop.WarmLoop.warm_now`, reason ``replica``): what the window tick would warm
(the forecast's hottest prefixes within its capacity) plus its workload shapes and adapters.
The same scrape feeds the cold-cache detectors (hit-rate drop, request spike); their state and
the last observation of each replica are kept in the store Redis, so the beat task on any
worker and ``prewarm watch`` share what they saw, and cooldowns live there too (``SET NX PX``),
so two watchers cannot both fire.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import redis
from celery import shared_task
from prometheus_client.parser import text_string_to_metric_families

from pipeline.errors import BadInputError
from pipeline.triggers import (
    EngineSample,
    HitRateDropDetector,
    ReplicaObservation,
    SpikeDetector,
    TriggerEvent,
    counter_delta,
    replica_event,
)
from tasks.adapters import redis_keys
from tasks.base import PrewarmTask
from tasks.celery_app import app
from tasks.events import store_client
from tasks.settings import EngineSettings, Settings, current_settings
from tasks.telemetry import record_engine_sample, record_trigger

REPLICA_COOLDOWN_S = 30.0
TRIGGER_COOLDOWN_S = 300.0
_COUNTERS = {
    "vllm:prefix_cache_queries_total": "prefix_queries",
    "vllm:prefix_cache_hits_total": "prefix_hits",
    "vllm:num_requests_waiting": "waiting",
    "vllm:request_success_total": "requests",
    "process_start_time_seconds": "start_time",
}
_TTFT_BUCKET = "vllm:time_to_first_token_seconds_bucket"


def parse_metrics(engine: str, text: str, ts: float) -> EngineSample:
    """An :class:`EngineSample` from Prometheus text (series summed over their labels)."""
    values: dict[str, float] = {}
    buckets: dict[float, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                field = _COUNTERS.get(sample.name)
                if field is not None:
                    values[field] = values.get(field, 0.0) + float(sample.value)
                elif sample.name == _TTFT_BUCKET:
                    le = float(sample.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + float(sample.value)
    except ValueError as exc:
        raise BadInputError(f"unreadable /metrics: {exc}", where=f"engine {engine}") from exc
    return EngineSample(engine, ts, ttft_buckets=tuple(sorted(buckets.items())), **values)


def _get(client: httpx.Client, path: str) -> httpx.Response | None:
    try:
        return client.get(path)
    except httpx.HTTPError:
        return None


def _models(response: httpx.Response | None) -> tuple[str, ...]:
    if response is None or response.status_code != 200:
        return ()
    try:
        return tuple(str(m["id"]) for m in response.json().get("data", []))
    except (ValueError, KeyError, TypeError, AttributeError):
        return ()


def observe(
    engine: EngineSettings, timeout_s: float = 2.0
) -> tuple[ReplicaObservation, EngineSample | None]:
    """Look at one replica once; an unreachable one is observed as unhealthy."""
    now = time.time()
    with httpx.Client(base_url=engine.url, timeout=timeout_s) as client:
        health = _get(client, "/health")
        healthy = health is not None and health.status_code == 200
        models = _models(_get(client, "/v1/models")) if healthy else ()
        metrics = _get(client, "/metrics") if healthy else None
    sample = None
    if metrics is not None and metrics.status_code == 200:
        sample = parse_metrics(engine.name, metrics.text, now)
    start = sample.start_time if sample else None
    return ReplicaObservation(engine.name, now, healthy, models, start), sample


def _last(store: redis.Redis, engine: str) -> ReplicaObservation | None:
    raw = store.get(redis_keys.REPLICA_LAST.format(engine=engine))
    if not raw:
        return None
    data = json.loads(raw)
    return ReplicaObservation(**{**data, "models": tuple(data["models"])})


def cooldown_allows(store: redis.Redis, event: TriggerEvent, seconds: float) -> bool:
    """Claim the cooldown of ``event``'s kind and engine; False while one is running."""
    key = redis_keys.TRIGGER_COOLDOWN.format(kind=event.kind, engine=event.engine)
    claimed = bool(store.set(key, str(event.ts), nx=True, px=max(1, int(seconds * 1000))))
    return record_trigger(store, event.engine, event.kind, claimed)


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
    store: redis.Redis, sample: EngineSample, cooldown_s: float = TRIGGER_COOLDOWN_S
) -> list[TriggerEvent]:
    """Feed one scrape to the engine's detectors (state in the store); the events that fired
    past their cooldown."""
    key = redis_keys.TRIGGER_DETECTORS.format(engine=sample.engine)
    detectors = EngineDetectors.from_json(store.get(key))
    previous = detectors.previous
    if previous is not None and previous.start_time != sample.start_time:
        # A new engine process: its counters and its cache start from zero, and the replica
        # watch warms it; a "drop" measured across the restart would only warm it twice.
        detectors = EngineDetectors()
    events = detectors.observe(sample)
    store.set(key, detectors.to_json())
    return [e for e in events if cooldown_allows(store, e, cooldown_s)]


def warm_replica(
    settings: Settings, store: redis.Redis, engine: EngineSettings, reason: str
) -> dict[str, Any]:
    """Warm ``engine`` through the loop now; ``reason`` is a trigger kind (``replica_ready``,
    ``replica_restarted``, ``hit_rate_drop`` …). Returns the outcome (its plan id and size)."""
    from tasks.loop import WarmLoop

    plan_reason = "replica" if reason.startswith("replica") else "trigger"
    outcome = WarmLoop(settings, store).warm_now(engine.name, plan_reason)
    return {"engine": engine.name, "reason": reason, "items": outcome["planned"],
            "plan_id": outcome["plan_id"], "status": outcome["status"]}  # fmt: skip


def watch_replica(
    settings: Settings, store: redis.Redis, engine: EngineSettings
) -> tuple[dict[str, Any] | None, EngineSample | None]:
    """Observe one replica, remember it, and warm it if it became ready or restarted.

    Returns what was warmed (or None) and the metrics sample, for the cold-cache detectors.
    """
    current, sample = observe(engine)
    record_engine_sample(store, engine.name, sample)
    previous = _last(store, engine.name)
    store.set(redis_keys.REPLICA_LAST.format(engine=engine.name), json.dumps(asdict(current)))
    event = replica_event(previous, current)
    if event is None or not cooldown_allows(store, event, REPLICA_COOLDOWN_S):
        return None, sample
    return {**event.to_dict(), **warm_replica(settings, store, engine, event.kind)}, sample


def watch_engine(
    settings: Settings,
    store: redis.Redis,
    engine: EngineSettings,
    cooldown_s: float = TRIGGER_COOLDOWN_S,
) -> list[dict[str, Any]]:
    """One look at ``engine``: warm a replica that started, and act on cold-cache triggers."""
    replica, sample = watch_replica(settings, store, engine)
    fired = [replica] if replica else []
    if sample is not None:
        for event in detect_cold_cache(store, sample, cooldown_s) if not replica else ():
            fired.append(
                {**event.to_dict(), "task_id": queue_warm_engine(event.engine, event.kind)}
            )
    return fired


@shared_task(
    name="prewarm.events.replica_watch", base=PrewarmTask, periodic=True, ignore_result=True
)
def replica_watch() -> dict[str, Any]:
    """Poll every configured engine once (beat runs this every ``schedule.replica_watch_s``):
    replicas that started are warmed, cold-cache triggers queue a warm-up."""
    settings = current_settings()
    store = store_client(settings)
    fired = [f for engine in settings.engines for f in watch_engine(settings, store, engine)]
    return {"engines": len(settings.engines), "warmed": fired}


@shared_task(name="prewarm.events.warm_engine", base=PrewarmTask)
def warm_engine(engine: str, reason: str) -> dict[str, Any]:
    """Warm ``engine`` now (a cold-cache trigger fired for it)."""
    settings = current_settings()
    return warm_replica(settings, store_client(settings), settings.engine(engine), reason)


def queue_warm_engine(engine: str, reason: str) -> str:
    """Queue ``warm_engine`` on prewarm's app; returns the task id."""
    return str(app.tasks["prewarm.events.warm_engine"].apply_async((engine, reason)).id)
