"""Looking at a fleet's router over HTTP: is it up, and which workers it routes to.

``vllm-router`` (and ``sglang-router``, the same lineage) answer ``GET /list_workers`` with
``{"urls": [...]}`` and ``GET /health`` with 200 — or, while one of its workers fails its health
checks (a replica restarting), with 503 ``Unhealthy servers: [...]``: the router is up then,
and its memory is intact. The router is never asked for metrics or used to verify a warm-up: it
answers those for one replica of its choosing."""

from __future__ import annotations

import httpx

from pipeline.errors import BadInputError, EngineUnavailableError
from tasks.adapters.engine_client import samples_from_text
from tasks.settings.fleets import FleetSettings

#: how vllm-router 0.1.17 begins its 503 ``/health`` answer while a worker is unhealthy
UNHEALTHY_WORKERS = "Unhealthy servers"


class RouterClient:
    """Calls to one fleet's router (a short-lived client per look)."""

    def __init__(
        self,
        fleet: FleetSettings,
        *,
        timeout_s: float = 2.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.fleet = fleet
        self.http = httpx.Client(base_url=fleet.router_url, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RouterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_up(self) -> bool:
        """Whether the router answers ``/health``: 200, or 503 naming its unhealthy workers (a
        replica down is not the router down; taken for one, a rolling restart of the replicas
        looked like a router restart and warmed every replica again)."""
        try:
            response = self.http.get("/health")
        except httpx.HTTPError:
            return False
        if response.status_code == 200:
            return True
        return response.status_code == 503 and response.text.startswith(UNHEALTHY_WORKERS)

    def requests_served(self) -> float | None:
        """The router's ``vllm_router_requests_total`` summed over routes, from its own
        Prometheus endpoint (None: none configured, or it did not answer)."""
        if self.fleet.router_metrics_url is None:
            return None
        try:
            response = self.http.get(self.fleet.router_metrics_url)
        except httpx.HTTPError:
            return None
        if response.status_code >= 400:
            return None
        samples = samples_from_text(response.text, frozenset({"vllm_router_requests_total"}))
        return sum(value for _, _, value in samples)

    def workers(self) -> list[str]:
        """The worker URLs the router routes to now, without a trailing ``/``."""
        where = f"fleet {self.fleet.name}: {self.fleet.router_url}/list_workers"
        try:
            response = self.http.get("/list_workers")
        except httpx.HTTPError as exc:
            raise EngineUnavailableError(f"{where}: {exc}") from exc
        if response.status_code >= 400:
            raise EngineUnavailableError(f"{where}: HTTP {response.status_code}")
        try:
            urls = response.json()["urls"]
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInputError(f"no worker list ({exc})", where=where) from exc
        if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
            raise BadInputError("'urls' is not a list of URLs", where=where)
        return sorted({u.rstrip("/") for u in urls})
