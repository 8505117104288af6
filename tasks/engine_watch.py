"""Watching engine replicas: health, served models, process start time and cache metrics.

A replica that becomes ready or restarts gets a warm-up at once: one request per workload shape
of the newest ingest, its adapters, and the hottest template heads of its model. The last
observation of each replica is kept in Redis, so the beat task and ``prewarm watch`` share what
they saw, and cooldowns live in Redis too (``SET NX EX``), so two watchers cannot both fire.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import redis
from celery import shared_task
from prometheus_client.parser import text_string_to_metric_families

from pipeline.errors import BadInputError
from pipeline.plan import PlanBudget, WarmItem, WarmPlan, new_plan_id
from pipeline.planning import shape_items
from pipeline.prefix import DEFAULT_BLOCK_SIZE, count_tokens
from pipeline.triggers import EngineSample, ReplicaObservation, TriggerEvent, replica_event
from tasks.celery_app import app
from tasks.events import store_client
from tasks.rewarm import hotness, serving
from tasks.settings import EngineSettings, Settings, current_settings
from tasks.telemetry import record_engine_sample, record_trigger
from tasks.warm import submit_plan

_LAST = "prewarm:replicas:{engine}:last"
_COOLDOWN = "prewarm:triggers:cooldown:{kind}:{engine}"
REPLICA_COOLDOWN_S = 30.0
#: Records read for workload shapes: enough to see every (prompt, output) length bucket.
RECENT_RECORDS = 20_000
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
    raw = store.get(_LAST.format(engine=engine))
    if not raw:
        return None
    data = json.loads(raw)
    return ReplicaObservation(**{**data, "models": tuple(data["models"])})


def cooldown_allows(store: redis.Redis, event: TriggerEvent, seconds: float) -> bool:
    """Claim the cooldown of ``event``'s kind and engine; False while one is running."""
    key = _COOLDOWN.format(kind=event.kind, engine=event.engine)
    claimed = bool(store.set(key, str(event.ts), nx=True, px=max(1, int(seconds * 1000))))
    return record_trigger(store, event.engine, event.kind, claimed)


def _template_heads(
    settings: Settings, store: redis.Redis, engine: EngineSettings
) -> list[WarmItem]:
    heads: list[tuple[int, WarmItem]] = []
    for repo in settings.template_repos:
        if repo.model not in (None, engine.model):
            continue
        heat = hotness(store, repo.name)
        for template_id, record in serving(store, repo.name).items():
            head = record.get("static_prefix") or ""
            if count_tokens(head) >= DEFAULT_BLOCK_SIZE:  # engines cache whole blocks only
                key = f"template-head:{engine.name}:{record['tag']}"
                item = WarmItem(
                    kind="prefix", key=key, model=engine.model, text=head, template=record["tag"]
                )
                heads.append((heat.get(template_id, 0), item))
    heads.sort(key=lambda pair: (pair[0], pair[1].key))  # priming order: hottest last
    return [item for _, item in heads][-settings.budget.max_items :]


def recent_records(data_dir: Path, rows: int = RECENT_RECORDS) -> pd.DataFrame | None:
    """The last ``rows`` records of the newest ingest under ``<data_dir>/ingest``, if any."""
    found = sorted((data_dir / "ingest").rglob("records.parquet"), key=lambda p: p.stat().st_mtime)
    if not found:
        return None
    columns = ["prompt", "prompt_tokens", "output_tokens", "model"]
    return pd.read_parquet(found[-1], columns=columns).tail(rows)


def replica_items(settings: Settings, store: redis.Redis, engine: EngineSettings) -> list[WarmItem]:
    """A fresh replica's warm-up, in priming order: one request per workload shape seen in the
    newest ingest (so every shape has run once), its adapters, then the serving template heads
    of its model, hottest last."""
    records = recent_records(settings.data_dir)
    shapes = shape_items(records, engine.model) if records is not None else []
    adapters = [
        WarmItem(
            kind="adapter", key=f"adapter:{engine.name}:{name}", model=engine.model, adapter=name
        )
        for name in engine.adapters
    ]
    return shapes + adapters + _template_heads(settings, store, engine)


def warm_replica(
    settings: Settings, store: redis.Redis, engine: EngineSettings, reason: str
) -> dict[str, Any]:
    """Submit a warm-up plan for ``engine``; returns the plan id and its size."""
    items = replica_items(settings, store, engine)
    if not items:
        return {"engine": engine.name, "reason": reason, "items": 0}
    budget = PlanBudget(max_items=len(items), batch_size=settings.budget.batch_size)
    plan = WarmPlan(new_plan_id(), engine.name, tuple(items), budget, notes=(reason,))
    return {
        "engine": engine.name,
        "reason": reason,
        "items": len(items),
        "plan_id": submit_plan(plan, engine.name, settings=settings),
    }


def watch_replica(
    settings: Settings, store: redis.Redis, engine: EngineSettings
) -> tuple[dict[str, Any] | None, EngineSample | None]:
    """Observe one replica, remember it, and warm it if it became ready or restarted.

    Returns what was warmed (or None) and the metrics sample, for the cold-cache detectors.
    """
    current, sample = observe(engine)
    record_engine_sample(store, engine.name, sample)
    previous = _last(store, engine.name)
    store.set(_LAST.format(engine=engine.name), json.dumps(asdict(current)))
    event = replica_event(previous, current)
    if event is None or not cooldown_allows(store, event, REPLICA_COOLDOWN_S):
        return None, sample
    return {**event.to_dict(), **warm_replica(settings, store, engine, event.kind)}, sample


@shared_task(name="prewarm.events.replica_watch", acks_late=True)
def replica_watch() -> dict[str, Any]:
    """Poll every configured engine once (beat runs this every ``schedule.replica_watch_s``)."""
    settings = current_settings()
    store = store_client(settings)
    fired = [watch_replica(settings, store, engine)[0] for engine in settings.engines]
    return {"engines": len(settings.engines), "warmed": [f for f in fired if f]}


@shared_task(name="prewarm.events.warm_engine", acks_late=True)
def warm_engine(engine: str, reason: str) -> dict[str, Any]:
    """Warm ``engine`` now (a cold-cache trigger fired for it)."""
    settings = current_settings()
    return warm_replica(settings, store_client(settings), settings.engine(engine), reason)


def queue_warm_engine(engine: str, reason: str) -> str:
    """Queue ``warm_engine`` on prewarm's app; returns the task id."""
    return str(app.tasks["prewarm.events.warm_engine"].apply_async((engine, reason)).id)
