"""The ``api`` service: health, Prometheus metrics, and the git webhooks.

``GET /health`` answers 200 with JSON when the broker and the store answer, 503 naming what is
down otherwise. ``GET /metrics`` exposes prewarm's own metrics (the process's default registry,
where the webhook counters live, plus queue depths read from the broker at scrape time).
Routes of ``jobs.webhooks`` are mounted when that module is installed.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from typing import Any

import redis
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from pipeline.errors import PrewarmError
from tasks.celery_app import QUEUES
from tasks.connections import ping_redis, redacted
from tasks.settings import Settings, current_settings

SERVICE = "prewarm-api"
#: Modules whose ``webhook_routes()`` the api mounts, if they are installed.
ROUTE_PROVIDERS = ("jobs.webhooks", "jobs.cmd_status")


class QueueDepthCollector(Collector):
    """Broker queue lengths and Redis reachability, read when Prometheus scrapes."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "prewarm_redis_up", "Whether a Redis answers PING (1) or not (0)", labels=["role"]
        )
        depth = GaugeMetricFamily(
            "prewarm_queue_length", "Messages waiting in a Celery queue", labels=["queue"]
        )
        client = redis.Redis.from_url(
            self.settings.redis_url, socket_connect_timeout=1, socket_timeout=1
        )
        try:
            for queue in QUEUES:
                depth.add_metric([queue], float(client.llen(queue)))
            up.add_metric(["broker"], 1.0)
        except (redis.ConnectionError, redis.TimeoutError):
            up.add_metric(["broker"], 0.0)
        finally:
            client.close()
        yield up
        yield depth


def _redis_status(url: str, role: str) -> str:
    try:
        ping_redis(url, role=role, timeout_s=1.0)
    except PrewarmError as exc:
        return str(exc)
    return "ok"


def health_payload(settings: Settings) -> tuple[int, dict[str, Any]]:
    """Status code and body of ``/health``."""
    checks = {"broker": _redis_status(settings.redis_url, "the Redis broker")}
    if settings.store_redis_url != settings.redis_url:
        checks["store"] = _redis_status(settings.store_redis_url, "the Redis store")
    healthy = all(value == "ok" for value in checks.values())
    body = {
        "status": "ok" if healthy else "unavailable",
        "service": SERVICE,
        "redis": checks,
        "broker_url": redacted(settings.redis_url),
        "time": time.time(),
    }
    return (200 if healthy else 503), body


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


def build_api(settings: Settings | None = None) -> Starlette:
    """The api service's ASGI app; settings are read on first request when not given."""
    resolved: list[Settings] = [settings] if settings else []
    registry = CollectorRegistry()

    def current() -> Settings:
        if not resolved:
            resolved.append(current_settings())
            registry.register(QueueDepthCollector(resolved[0]))
        return resolved[0]

    if settings is not None:
        registry.register(QueueDepthCollector(settings))

    async def health(request: Request) -> Response:
        status, body = await run_in_threadpool(health_payload, current())
        return JSONResponse(body, status_code=status)

    async def metrics(request: Request) -> Response:
        current()
        text = generate_latest(REGISTRY) + await run_in_threadpool(generate_latest, registry)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    routes: list[BaseRoute] = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(routes=routes + _mounted_routes())
