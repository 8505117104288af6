"""``prewarm health …``: one check per service, for compose health checks and for people.

Each prints ``ok: …`` and exits 0, or ends with one line naming what is wrong (exit 2). URLs
are shown with their password masked.
"""

from __future__ import annotations

import socket
from typing import Annotated

import typer

from pipeline.errors import TransientError
from tasks.adapters.connections import (
    beat_heartbeat_age,
    check_engine_url,
    check_settings_redis,
    redacted,
)
from tasks.adapters.connections import http_get as _get
from tasks.celery_app import app as celery_app
from tasks.health_tasks import loop_health_problems
from tasks.settings import current_settings

health_app = typer.Typer(
    help="Check that a prewarm service (or an engine) is healthy.", no_args_is_help=True
)
Opt = typer.Option


def _ok(message: str) -> None:
    typer.echo(f"ok: {message}")


@health_app.command("redis")
def redis_check() -> None:
    """The broker (and the store, if separate) answer PING."""
    check_settings_redis(current_settings())
    _ok("redis answers")


@health_app.command("worker")
def worker_check(
    name: Annotated[str, Opt(help="Worker node name before '@' (as given to prewarm worker).")],
    host: Annotated[
        str | None, Opt(help="Host part of the node name (default: this host).")
    ] = None,
    timeout_s: Annotated[float, Opt(help="Seconds to wait for the answer.")] = 5.0,
) -> None:
    """The worker ``NAME@HOST`` answers a ping over the broker."""
    check_settings_redis(current_settings())
    node = f"{name}@{host or socket.gethostname()}"
    replies = celery_app.control.ping(destination=[node], timeout=timeout_s)
    if not any(node in reply for reply in replies):
        raise TransientError(f"worker {node} did not answer a ping within {timeout_s:g}s")
    _ok(f"worker {node} answers")


@health_app.command("beat")
def beat_check(
    max_age_s: Annotated[float, Opt(help="Oldest acceptable heartbeat, in seconds.")] = 60.0,
) -> None:
    """celery beat ticked recently (its heartbeat in Redis is fresh) and its periodic work did
    not fail (the loop's last ticks, the periodic tasks' last runs)."""
    age = beat_heartbeat_age(current_settings().store_redis_url)
    if age is None:
        raise TransientError("beat has not ticked yet (no heartbeat in Redis)")
    if age > max_age_s:
        raise TransientError(f"beat last ticked {age:.0f}s ago (limit {max_age_s:g}s)")
    problems = loop_health_problems()
    if problems:
        raise TransientError("; ".join(problems))
    _ok(f"beat ticked {age:.1f}s ago")


@health_app.command("api")
def api_check(
    url: Annotated[str | None, Opt(help="Base URL (default: from PREWARM_API_HOST/PORT).")] = None,
    timeout_s: Annotated[float, Opt(help="Seconds to wait.")] = 5.0,
) -> None:
    """The api answers ``GET /health`` with 200."""
    settings = current_settings()
    host = "127.0.0.1" if settings.api_host in ("0.0.0.0", "::") else settings.api_host
    base = url or f"http://{host}:{settings.api_port}"
    response = _get(f"{base.rstrip('/')}/health", timeout_s)
    if response.status_code != 200:
        raise TransientError(f"api at {redacted(base)} is unhealthy: {response.text[:200]}")
    _ok(f"api at {redacted(base)} is healthy")


@health_app.command("http")
def http_check(
    url: Annotated[
        str, typer.Argument(help="URL that must answer 200 (e.g. Flower's /healthcheck).")
    ],
    timeout_s: Annotated[float, Opt(help="Seconds to wait.")] = 5.0,
) -> None:
    """Any URL answers 200."""
    response = _get(url, timeout_s)
    if response.status_code != 200:
        raise TransientError(f"{redacted(url)} answered {response.status_code}")
    _ok(f"{redacted(url)} answers 200")


@health_app.command("engine")
def engine_check(
    engine: Annotated[str, typer.Argument(help="A configured engine's name, or a base URL.")],
) -> None:
    """An engine answers ``/health`` and ``/v1/models``."""
    url = (
        engine
        if engine.startswith(("http://", "https://"))
        else current_settings().engine(engine).url
    )
    info = check_engine_url(url)
    _ok(f"engine at {info['url']} serves {', '.join(map(str, info['models']))}")


def register(app: typer.Typer) -> None:
    """Add ``prewarm health`` to the CLI."""
    app.add_typer(health_app, name="health")
