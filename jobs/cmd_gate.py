"""``prewarm gate``: the gate's sidecar, beside one engine (a container of its pod).

It looks at its replica every ``--every`` seconds (50 ms: detection in milliseconds, not at
the replica watch's 10 s), warms it through the gate (:class:`tasks.services.gate.Gatekeeper`:
the fleet's hot set, planned here and sent directly on the replica's URL from this process,
then verified on it) and answers ``GET /ready`` on ``--port``: 503 until the hot set is
verified, 200 after, or once the fleet's ``gate_deadline_s`` passed. An engine pod's
``readinessProbe`` points at it, so the kubelet marks the pod Ready, and a Service, a router
or llm-d's scheduler admit it, only when it is warm. The replica's state is kept in the store:
``prewarm status``, ``/metrics`` and the api's ``GET /ready/{replica}`` see it too.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Annotated

import typer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pipeline.errors import BadInputError, PrewarmError
from tasks.adapters.store import Store, store_client
from tasks.services.gate import Gatekeeper, Timings, replica_readiness, run_here
from tasks.settings import EngineSettings, Settings, current_settings

logger = logging.getLogger(__name__)


def replica_settings(settings: Settings, url: str, fleet: str | None) -> tuple[Settings, str]:
    """``settings`` with ``url`` a replica of its gated fleet (a listed one, or ``fleet``,
    whose replicas are found, given this one), and the replica's engine name."""
    url = url.rstrip("/")
    for engine in settings.engines:
        if engine.url.rstrip("/") == url and engine.fleet is not None:
            return _gated(settings, engine), engine.name
    if fleet is None:
        raise BadInputError(f"{url} is not a listed replica of a fleet: name its --fleet",
                            where="--replica")  # fmt: skip
    chosen = settings.fleet(fleet)
    if not chosen.discovered:
        raise BadInputError(f"fleet {fleet} lists its replicas, and not {url}", where="--replica")
    current = settings.with_members({fleet: [url]})
    engine = next(e for e in current.replicas_of(fleet) if e.url.rstrip("/") == url)
    return _gated(current, engine), engine.name


def _gated(settings: Settings, engine: EngineSettings) -> Settings:
    assert engine.fleet is not None
    if not settings.fleet(engine.fleet).gate:
        raise BadInputError(f"fleet {engine.fleet} is not gated (gate = true)", where="--replica")
    return settings


class Sidecar:
    """The looks at one replica, in a thread, and its readiness answer."""

    def __init__(self, settings: Settings, store: Store, engine: str, every_s: float) -> None:
        self.settings, self.store, self.engine, self.every_s = settings, store, engine, every_s
        timings = Timings()
        self.gate = Gatekeeper(settings, store, run_here(settings, store, timings), timings=timings)
        self.stopping = threading.Event()

    def run(self) -> None:
        """Look every ``every_s`` until stopped (a failed look is logged and tried again).
        While the engine does not answer yet (it loads its model), the planner's imports are
        paid for once (:meth:`Gatekeeper.prepare`); an engine up at the first look is warmed
        at once."""
        prepared = False
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                seen = self.gate.look(only=self.engine)
            except PrewarmError as exc:
                logger.warning("gate %s: look failed: %s", self.engine, exc)
                seen = []
            if not seen and not prepared:
                self.gate.prepare()
                prepared = True
            self.stopping.wait(max(0.0, self.every_s - (time.monotonic() - started)))

    def app(self) -> Starlette:
        """``GET /ready``: the replica's readiness answer (JSON, 200 or 503)."""

        def ready(request: Request) -> Response:
            status, body = replica_readiness(self.settings, self.store, self.engine, time.time())
            return JSONResponse(body, status_code=status)

        return Starlette(routes=[Route("/ready", ready, methods=["GET"])])


def gate(
    replica: Annotated[str, typer.Option(help="The engine's URL beside this sidecar.")],
    fleet: Annotated[
        str | None,
        typer.Option(help="Its gated fleet, where the fleet does not list it (found by DNS)."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to serve /ready on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="Port to serve /ready on.")] = 8081,
    every: Annotated[float, typer.Option(help="Seconds between looks at the replica.")] = 0.05,
) -> None:
    """Warm the engine beside it before it takes traffic; answer its readiness (/ready)."""
    import uvicorn

    if every <= 0:
        raise typer.BadParameter("must be above 0", param_hint="--every")
    configured = current_settings()
    settings, engine = replica_settings(configured, replica, fleet)
    sidecar = Sidecar(settings, store_client(settings), engine, every)
    looks = threading.Thread(target=sidecar.run, name="gate-looks", daemon=True)
    looks.start()
    try:
        uvicorn.run(sidecar.app(), host=host, port=port, log_level="warning")
    finally:
        sidecar.stopping.set()
        looks.join(timeout=10)


def register(app: typer.Typer) -> None:
    """Add ``prewarm gate``."""
    app.command("gate")(gate)
