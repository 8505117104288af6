"""Looking at one engine replica over HTTP: health, served models, process start time, metrics."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pipeline.errors import BadInputError, PrewarmError
from pipeline.triggers import EngineSample, ReplicaObservation
from tasks.adapters.connections import tls_context
from tasks.settings import EngineSettings

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
    with httpx.Client(base_url=engine.url, timeout=timeout_s, verify=tls_context()) as client:
        health = _get(client, "/health")
        healthy = health is not None and health.status_code == 200
        models = _models(_get(client, "/v1/models")) if healthy else ()
        # (a replica's own metrics endpoint: never the router's, which answers for one replica)
        metrics = _get(client, engine.metrics_url or "/metrics") if healthy else None
    sample = None
    if metrics is not None and metrics.status_code == 200:
        sample = parse_metrics(engine.name, metrics.text, now)
    start = sample.start_time if sample else None
    return ReplicaObservation(engine.name, now, healthy, models, start), sample


def probe_replica(engine: EngineSettings, timeout_s: float = 1.0) -> tuple[bool, float | None]:
    """Whether ``engine`` answers ``/health``, and its process start time (from its metrics)."""
    try:
        with httpx.Client(base_url=engine.url, timeout=timeout_s, verify=tls_context()) as client:
            if client.get("/health").status_code != 200:
                return False, None
            metrics = client.get(engine.metrics_url or "/metrics")
    except httpx.HTTPError:
        return False, None
    if metrics.status_code != 200:
        return True, None
    try:
        return True, parse_metrics(engine.name, metrics.text, time.time()).start_time
    except PrewarmError:
        return True, None
