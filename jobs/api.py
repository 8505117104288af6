"""The ``api`` service: health, Prometheus metrics, and the git webhooks.

``GET /health`` answers 200 with JSON when the broker and the store answer — ``"status":
"degraded"`` with a line per problem (a fleet's router down, its replicas not found, a plan with
items not verified) and since when, ``"ok"`` with none — and 503 naming what is down otherwise.
``GET /ready/{replica}`` answers a gated replica's readiness (:mod:`pipeline.gate`): 503 until
prewarm has verified its hot set on it, 200 after (or once its deadline passed).
``GET /metrics`` exposes prewarm's own metrics: the process's default registry
(where the webhook counters live), queue depths read from the broker, and the whole cluster's
warm-up metrics (:mod:`tasks.adapters.telemetry`) and open WAL transactions read from the store,
all at scrape time.
Routes of ``jobs.webhooks`` are mounted when that module is installed.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from pipeline.errors import PrewarmError
from tasks.adapters import telemetry
from tasks.adapters.broker_queues import waiting_messages
from tasks.adapters.connections import ping_redis, redacted
from tasks.adapters.store import STORE_DOWN, probe_client
from tasks.adapters.wal_store import ACTIVE
from tasks.celery_app import QUEUES
from tasks.settings import Settings, current_settings

SERVICE = "prewarm-api"
#: Modules whose ``webhook_routes()`` the api mounts, if they are installed.
ROUTE_PROVIDERS = ("jobs.webhooks", "jobs.cmd_status")


class QueueDepthCollector(Collector):
    """Broker queue lengths and Redis reachability, read when Prometheus scrapes."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.client = probe_client(settings.redis_url)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "prewarm_redis_up", "Whether a Redis answers PING (1) or not (0)", labels=["role"]
        )
        depth = GaugeMetricFamily(
            "prewarm_queue_length", "Messages waiting in a Celery queue", labels=["queue"]
        )
        try:
            for queue, waiting in waiting_messages(self.client, QUEUES).items():
                depth.add_metric([queue], float(waiting))
            up.add_metric(["broker"], 1.0)
        except STORE_DOWN:
            up.add_metric(["broker"], 0.0)
        yield up
        yield depth


def _histograms(
    name: str, spec: telemetry.MetricSpec, rows: list[tuple[tuple[str, ...], float]]
) -> HistogramMetricFamily:
    """A histogram family from its stored parts (``le:<bound>``, ``sum``, ``count``)."""
    family = HistogramMetricFamily(name, spec.help, labels=list(spec.labels))
    parts: dict[tuple[str, ...], dict[str, float]] = {}
    for labels, value in rows:
        parts.setdefault(labels[:-1], {})[labels[-1]] = value
    for labels, part in sorted(parts.items()):
        buckets = [(f"{b:g}", part.get(f"le:{b:g}", 0.0)) for b in spec.buckets]
        buckets.append(("+Inf", part.get("count", 0.0)))
        family.add_metric(list(labels), buckets, part.get("sum", 0.0))
    return family


def _family(name: str, spec: telemetry.MetricSpec) -> CounterMetricFamily | GaugeMetricFamily:
    if spec.kind == "counter":
        return CounterMetricFamily(name, spec.help, labels=list(spec.labels))
    return GaugeMetricFamily(name, spec.help, labels=list(spec.labels))


class TelemetryCollector(Collector):
    """The cluster's warm-up metrics, as every worker recorded them in the store Redis, and
    the WAL's open and expired (stuck) transactions. One store round trip per scrape."""

    def __init__(self, store_url: str, clock: Any = time.time) -> None:
        self.store = probe_client(store_url, read_s=2.0)
        self.clock = clock

    def _read(self) -> tuple[dict[str, list[tuple[tuple[str, ...], float]]], int, int]:
        with self.store.pipeline(transaction=False) as pipe:
            pipe.hgetall(telemetry.SERIES)
            pipe.zcard(ACTIVE)
            pipe.zcount(ACTIVE, "-inf", self.clock())
            raw, open_txns, expired = pipe.execute()
        return telemetry.parse_series(raw), int(open_txns), int(expired)

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "prewarm_store_up", "Whether the store Redis answered this scrape (1) or not (0)"
        )
        try:
            series, open_txns, expired = self._read()
        except STORE_DOWN:
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        for name, spec in telemetry.SPECS.items():
            if spec.kind == "histogram":
                yield _histograms(name, spec, series.get(name, []))
                continue
            family = _family(name, spec)
            for labels, value in series.get(name, ()):
                family.add_metric(list(labels), value)
            yield family
        yield GaugeMetricFamily(
            "prewarm_wal_open_transactions", "WAL transactions not yet ended", value=open_txns
        )
        yield GaugeMetricFamily(
            "prewarm_wal_expired_transactions",
            "Open WAL transactions whose lease ran out (the sweep's work; stuck if it stays)",
            value=expired,
        )


def _redis_status(url: str, role: str) -> str:
    try:
        ping_redis(url, role=role, timeout_s=1.0)
    except PrewarmError as exc:
        return str(exc)
    return "ok"


def _problem_lines(settings: Settings, now: float) -> list[str]:
    """What makes prewarm not green (a router down, replicas not found, a plan with items not
    verified), one line each with since when; none when the store cannot be read."""
    from tasks.services.status import current_problems, problem_line

    try:
        found = current_problems(settings, probe_client(settings.store_redis_url), now)
    except STORE_DOWN:
        return []
    return [problem_line(p, now) for p in found]


def health_payload(settings: Settings, now: float | None = None) -> tuple[int, dict[str, Any]]:
    """Status code and body of ``/health``: 503 ``unavailable`` when a Redis does not answer;
    200 ``degraded``, naming each problem and since when, when prewarm runs but users may miss
    (``prewarm status`` exits non-zero then too); 200 ``ok`` otherwise."""
    now = time.time() if now is None else now
    checks = {"broker": _redis_status(settings.redis_url, "the Redis broker")}
    if settings.store_redis_url != settings.redis_url:
        checks["store"] = _redis_status(settings.store_redis_url, "the Redis store")
    healthy = all(value == "ok" for value in checks.values())
    found = _problem_lines(settings, now) if healthy else []
    body = {
        "status": ("degraded" if found else "ok") if healthy else "unavailable",
        "service": SERVICE,
        "redis": checks,
        "problems": found,
        "broker_url": redacted(settings.redis_url),
        "time": now,
    }
    return (200 if healthy else 503), body


def ready_payload(settings: Settings, replica: str) -> tuple[int, dict[str, Any]]:
    """``GET /ready/{replica}`` (engine name or URL): the gate's readiness answer, 200 once
    prewarm verified the replica's hot set (or its deadline passed), 503 before; 503 too when
    the store does not answer (a probe that cannot tell says not ready)."""
    from tasks.services.gate import replica_readiness

    try:
        return replica_readiness(settings, probe_client(settings.store_redis_url), replica,
                                 time.time())  # fmt: skip
    except STORE_DOWN as exc:
        return 503, {"replica": replica, "ready": False, "why": f"store down: {exc}"}


def _mounted_routes() -> list[BaseRoute]:
    routes: list[BaseRoute] = []
    for name in ROUTE_PROVIDERS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        routes.extend(module.webhook_routes())
    return routes


def _register(registry: CollectorRegistry, settings: Settings) -> None:
    registry.register(QueueDepthCollector(settings))
    registry.register(TelemetryCollector(settings.store_redis_url))


def build_api(settings: Settings | None = None) -> Starlette:
    """The api service's ASGI app; settings are read on first request when not given."""
    resolved: list[Settings] = [settings] if settings else []
    registry = CollectorRegistry()

    def current() -> Settings:
        if not resolved:
            resolved.append(current_settings())
            _register(registry, resolved[0])
        return resolved[0]

    if settings is not None:
        _register(registry, settings)

    async def health(request: Request) -> Response:
        status, body = await run_in_threadpool(health_payload, current())
        return JSONResponse(body, status_code=status)

    async def metrics(request: Request) -> Response:
        current()
        text = generate_latest(REGISTRY) + await run_in_threadpool(generate_latest, registry)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def ready(request: Request) -> Response:
        status, body = await run_in_threadpool(
            ready_payload, current(), request.path_params["replica"]
        )
        return JSONResponse(body, status_code=status)

    routes: list[BaseRoute] = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/ready/{replica:path}", ready, methods=["GET"]),
    ]
    return Starlette(routes=routes + _mounted_routes())
