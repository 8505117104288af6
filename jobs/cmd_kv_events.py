"""``prewarm kv-events``: follow one engine's KV-cache event stream as a long-running service.

It subscribes to the engine's ZMQ publisher (``--endpoint``; ``--replay-endpoint`` to fill gaps;
both, and the topic, from the engine's ``[[sources]] kind = "kv-events"`` entry when not given),
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
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.errors import BadInputError, TransientError

if TYPE_CHECKING:
    from tasks.services.kv_follow import KvSource
    from tasks.settings import Settings

Opt = typer.Option


def _check(engine: str) -> None:
    from tasks.adapters.kv_state import KvStateStore
    from tasks.adapters.store import store_client

    if not KvStateStore(store_client(), engine).alive():
        raise TransientError(f"no live kv-events service for engine {engine!r}")
    typer.echo(f"kv-events {engine}: alive")


def kv_events(
    engine: Annotated[str, Opt(help="The engine (replica) whose events these are.")],
    endpoint: Annotated[
        str | None,
        Opt(
            help="The engine's PUB endpoint, e.g. tcp://vllm:5557 (default: its kv-events source)."
        ),
    ] = None,
    replay_endpoint: Annotated[
        str | None, Opt(help="Its ROUTER replay endpoint, e.g. tcp://vllm:5558.")
    ] = None,
    topic: Annotated[
        str | None, Opt(help="Topic the engine publishes on (vLLM's default: empty).")
    ] = None,
    restore: Annotated[
        bool, Opt(help="Re-prime what the replica held when it comes back empty.")
    ] = True,
    check: Annotated[bool, Opt(help="Only check that the service runs (a health check).")] = False,
) -> None:
    """Follow an engine's vLLM KV-cache events: holdings, counts, restores, verification."""
    if check:
        _check(engine)
        return
    from tasks.adapters.store import store_client
    from tasks.services.kv_follow import follow
    from tasks.settings import current_settings
    from tasks.warm_tasks import submitter

    settings = current_settings()
    source = kv_source(settings, engine, endpoint, replay_endpoint, topic)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the engine probes, every few seconds
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    report = follow(source, settings, store_client(settings), submit=submitter(settings),
                    stop=stop, restore=restore)  # fmt: skip
    typer.echo(f"kv-events {engine}: {report.batches} batches, {report.resets} resets, "
               f"{len(report.restores)} restores, {report.counters}")  # fmt: skip


def kv_source(
    settings: Settings,
    engine: str,
    endpoint: str | None,
    replay_endpoint: str | None,
    topic: str | None,
) -> KvSource:
    """The stream to follow: the options given, else the engine's kv-events source."""
    from tasks.services.kv_follow import KvSource

    if endpoint is None:  # the settings' stream (options given still win)
        configured = settings.kv_events_of(engine)
        if configured is None:
            raise BadInputError(
                f"needs a ZMQ endpoint: --endpoint tcp://host:port, or a [[sources]] entry with "
                f'engine = "{engine}", kind = "kv-events" and its endpoint in the settings',
                where="--endpoint",
            )
        endpoint = configured.endpoint
        replay_endpoint = replay_endpoint or configured.replay_endpoint
        topic = configured.topic if topic is None else topic
    _zmq_option("--endpoint", endpoint)
    if replay_endpoint is not None:
        _zmq_option("--replay-endpoint", replay_endpoint)
    return KvSource(engine, endpoint, replay_endpoint, topic or "")


def _zmq_option(option: str, value: str) -> None:
    from tasks.settings import zmq_endpoint

    try:
        zmq_endpoint(value)
    except ValueError as exc:
        raise BadInputError(str(exc), where=option) from None


def register(app: typer.Typer) -> None:
    """Add ``prewarm kv-events`` to the CLI."""
    app.command("kv-events")(kv_events)
