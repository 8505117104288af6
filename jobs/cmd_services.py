"""Long-running services as ``prewarm`` commands: ``api``, ``worker``, ``beat``, ``flower``.

Compose and the README start every service through these, so configuration is read the same
way everywhere (``PREWARM_*`` and the TOML file) and an unreachable Redis is one clear line.
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer

from pipeline.errors import BadInputError
from tasks.adapters.connections import check_settings_redis
from tasks.celery_app import QUEUES
from tasks.celery_app import app as celery_app
from tasks.settings import Settings, current_settings

Opt = typer.Option
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def parse_queues(text: str) -> list[str]:
    """Queue names from ``ingest,warm``; unknown names are bad input."""
    queues = [q.strip() for q in text.split(",") if q.strip()]
    unknown = sorted(set(queues) - set(QUEUES))
    if not queues or unknown:
        raise BadInputError(
            f"unknown queue(s) {unknown or text!r}; known: {', '.join(QUEUES)}", where="--queues"
        )
    return queues


def beat_schedule(settings: Settings) -> dict[str, Any]:
    """The periodic tasks: ``jobs.beat``'s schedule when that module exists, else none."""
    try:
        module = importlib.import_module("jobs.beat")
    except ModuleNotFoundError as exc:
        if exc.name != "jobs.beat":
            raise
        return {}
    provider = getattr(module, "beat_schedule", None)
    if callable(provider):
        return dict(provider(settings))
    return dict(getattr(module, "BEAT_SCHEDULE", {}))


def api(
    host: Annotated[str | None, Opt(help="Address (default: PREWARM_API_HOST).")] = None,
    port: Annotated[int | None, Opt(help="Port (default: PREWARM_API_PORT).")] = None,
) -> None:
    """Serve the api: /health, /metrics and the git webhooks."""
    import uvicorn

    from jobs.api import build_api

    settings = current_settings()
    check_settings_redis(settings)
    uvicorn.run(
        build_api(settings), host=host or settings.api_host, port=port or settings.api_port,
        log_level=settings.log_level.lower(), server_header=False,
    )  # fmt: skip


def worker(
    queues: Annotated[str, Opt(help="Comma-separated queues to consume.")] = ",".join(QUEUES),
    concurrency: Annotated[int, Opt(min=1, help="Worker processes.")] = 2,
    name: Annotated[str | None, Opt(help="Node name before '@host' (default: the queues).")] = None,
    pool: Annotated[str, Opt(help="Celery pool: prefork, threads or solo.")] = "prefork",
) -> None:
    """Run a Celery worker on some of prewarm's queues."""
    chosen = parse_queues(queues)
    settings = current_settings()
    check_settings_redis(settings)
    node = name or "-".join(chosen)
    celery_app.worker_main(
        ["worker", "-Q", ",".join(chosen), "-c", str(concurrency), "--pool", pool,
         "-n", f"{node}@%h", "--loglevel", settings.log_level, "-E"]
    )  # fmt: skip


def beat() -> None:
    """Run celery beat with prewarm's schedule; it records a heartbeat on every tick. A fleet
    whose router answers with another kind's API is refused here, naming the field."""
    from tasks.adapters.router_client import check_router_apis

    settings = current_settings()
    check_settings_redis(settings)
    check_router_apis(settings.fleets)
    state_dir = settings.host_dir  # the beat's own schedule file: host-local
    state_dir.mkdir(parents=True, exist_ok=True)
    celery_app.conf.beat_schedule = beat_schedule(settings)
    celery_app.start(
        ["beat", "-S", "jobs.heartbeat:HeartbeatScheduler",
         "-s", str(state_dir / "celerybeat-schedule"), "--loglevel", settings.log_level]
    )  # fmt: skip


def flower(
    port: Annotated[int, Opt(help="Port of Flower's web UI.")] = 5555,
    address: Annotated[str, Opt(help="Address of Flower's web UI.")] = "127.0.0.1",
) -> None:
    """Run Flower (the Celery monitor) against prewarm's broker."""
    settings = current_settings()
    check_settings_redis(settings)
    celery_app.start(["flower", f"--port={port}", f"--address={address}"])


def register(app: typer.Typer) -> None:
    """Add the service commands to the CLI."""
    for command in (api, worker, beat, flower):
        app.command(command.__name__)(command)
