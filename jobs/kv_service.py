"""``prewarm kv-events``: follow one engine's KV-cache event stream as a long-running service.

It subscribes to the engine's ZMQ publisher (``--endpoint``; ``--replay-endpoint`` to fill gaps),
keeps what the replica holds, writes item × window counts and a snapshot under
``<data_dir>/kv/<engine>/``, mirrors the held set in Redis for verification, and restores the
replica through the planner when it comes back empty (``--no-restore`` to only observe).
``prewarm kv-events --check --engine NAME`` is its health check: it exits 0 while the service's
heartbeat is fresh.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Annotated

import typer

from pipeline.errors import BadInputError, TransientError

Opt = typer.Option


def _check(engine: str) -> None:
    from tasks.events import store_client
    from tasks.kv_state import KvStateStore

    if not KvStateStore(store_client(), engine).alive():
        raise TransientError(f"no live kv-events service for engine {engine!r}")
    typer.echo(f"kv-events {engine}: alive")


def kv_events(
    engine: Annotated[str, Opt(help="The engine (replica) whose events these are.")],
    endpoint: Annotated[
        str | None, Opt(help="The engine's PUB endpoint, e.g. tcp://vllm:5557.")
    ] = None,
    replay_endpoint: Annotated[
        str | None, Opt(help="Its ROUTER replay endpoint, e.g. tcp://vllm:5558.")
    ] = None,
    topic: Annotated[str, Opt(help="Topic the engine publishes on (vLLM's default: empty).")] = "",
    restore: Annotated[
        bool, Opt(help="Re-prime what the replica held when it comes back empty.")
    ] = True,
    check: Annotated[bool, Opt(help="Only check that the service runs (a health check).")] = False,
) -> None:
    """Follow an engine's vLLM KV-cache events: holdings, counts, restores, verification."""
    if check:
        _check(engine)
        return
    if not endpoint or not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
        raise BadInputError("needs a ZMQ endpoint (tcp://host:port)", where="--endpoint")
    from tasks.events import store_client
    from tasks.kv_source import KvSource, follow
    from tasks.settings import current_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the engine probes, every few seconds
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    settings = current_settings()
    source = KvSource(engine, endpoint, replay_endpoint, topic)
    report = follow(source, settings, store_client(settings), stop=stop, restore=restore)
    typer.echo(f"kv-events {engine}: {report.batches} batches, {report.resets} resets, "
               f"{len(report.restores)} restores, {report.counters}")  # fmt: skip


def register(app: typer.Typer) -> None:
    """Add ``prewarm kv-events`` to the CLI."""
    app.command("kv-events")(kv_events)
