"""Looking at a fleet's router over HTTP: is it up, and which workers it routes to.

Each router kind lists its workers at its own route (:mod:`pipeline.router_kinds`:
``vllm-router``'s ``GET /list_workers``, ``sglang-router``'s ``GET /workers``) and counts its
requests under its own name. ``GET /health`` answers 200 — or, on vllm-router while one of its
workers fails its health checks (a replica restarting), 503 ``Unhealthy servers: [...]``: the
router is up then, and its memory is intact. The router is never asked for a replica's metrics
or used to verify a warm-up: it answers those for one replica of its choosing."""

from __future__ import annotations

from collections.abc import Sequence

import httpx

from pipeline.errors import EngineUnavailableError
from pipeline.router_kinds import RouterApiError, WorkerEdit, router_kind
from tasks.adapters.connections import tls_context
from tasks.adapters.engine_client import samples_from_text
from tasks.settings.fleets import FleetSettings

#: how vllm-router 0.1.17 begins its 503 ``/health`` answer while a worker is unhealthy
UNHEALTHY_WORKERS = "Unhealthy servers"
#: seconds an add or a remove may take (vllm-router checks a worker's health before it adds it)
EDIT_TIMEOUT_S = 30.0


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
        self.kind = router_kind(fleet.router)
        self.http = httpx.Client(
            base_url=fleet.router_url, timeout=timeout_s, transport=transport, verify=tls_context()
        )

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
        """The router's requests counter (``vllm_router_requests_total``,
        ``smg_router_requests_total``) summed over its labels, from its own Prometheus endpoint
        (None: none configured, or it did not answer)."""
        if self.fleet.router_metrics_url is None:
            return None
        try:
            response = self.http.get(self.fleet.router_metrics_url)
        except httpx.HTTPError:
            return None
        if response.status_code >= 400:
            return None
        samples = samples_from_text(response.text, frozenset({self.kind.requests_counter}))
        return sum(value for _, _, value in samples)  # (none yet: a fresh router, 0)

    def workers(self) -> list[str]:
        """The worker URLs the router routes to now, without a trailing ``/``. A 404 on the
        kind's worker list, or a body not of its shape, is :class:`RouterApiError`: the router
        is not the kind (or version) the settings say."""
        path = self.kind.workers_path
        where = f"fleet {self.fleet.name}: {self.fleet.router_url}{path}"
        try:
            response = self.http.get(path)
        except httpx.HTTPError as exc:
            raise EngineUnavailableError(f"{where}: {exc}") from exc
        if response.status_code in (404, 405):
            raise RouterApiError(
                f"HTTP {response.status_code}: not the worker list of {self.kind.name} "
                f"{self.kind.versions} (is the router's kind, fleets.router, right?)",
                where=where,
            )
        if response.status_code >= 400:
            raise EngineUnavailableError(f"{where}: HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError as exc:
            raise RouterApiError(f"not JSON ({exc})", where=where) from exc
        return self.kind.workers(body, where)

    def add_worker(self, url: str) -> None:
        """Add replica ``url`` to the router's worker list (:attr:`RouterKind.add`)."""
        self._edit(self.kind.add, url, "add")

    def remove_worker(self, url: str) -> None:
        """Remove replica ``url`` from the router's worker list; one it does not list is left
        as it is."""
        edit = self.kind.remove
        path = edit.path
        if edit.by_id:
            worker_id = self._worker_ids().get(url.rstrip("/"))
            if worker_id is None:
                return
            path = path.format(id=worker_id)
        self._edit(WorkerEdit(edit.method, path, edit.url_as), url, "remove")

    def _worker_ids(self) -> dict[str, str]:
        where = f"fleet {self.fleet.name}: {self.fleet.router_url}{self.kind.workers_path}"
        try:
            response = self.http.get(self.kind.workers_path)
            return self.kind.ids_from(response.json())
        except (httpx.HTTPError, ValueError) as exc:
            raise EngineUnavailableError(f"{where}: {exc}") from exc

    def _edit(self, edit: WorkerEdit, url: str, verb: str) -> None:
        where = f"fleet {self.fleet.name}: {verb} {url} at {self.fleet.router_url}{edit.path}"
        params = {"url": url} if edit.url_as == "query" else None
        body = {"url": url} if edit.url_as == "json" else None
        try:
            response = self.http.request(
                edit.method, edit.path, params=params, json=body, timeout=EDIT_TIMEOUT_S
            )
        except httpx.HTTPError as exc:
            raise EngineUnavailableError(f"{where}: {exc}") from exc
        if response.status_code in (404, 405):
            raise RouterApiError(f"HTTP {response.status_code}: not a route of "
                                 f"{self.kind.name} {self.kind.versions}", where=where)  # fmt: skip
        if response.status_code >= 400 and not (verb == "remove" and "not found" in response.text):
            raise EngineUnavailableError(f"{where}: HTTP {response.status_code} {response.text}")


def check_router_apis(fleets: Sequence[FleetSettings]) -> None:
    """Refuse, naming the field, a fleet whose router answers but not with the API of the kind
    it is configured as (another kind, or a version prewarm cannot drive): accepted, it would
    find no replica and warm nothing. A router that does not answer yet is left to the watch,
    which reports it down."""
    for n, fleet in enumerate(fleets):
        with RouterClient(fleet) as router:
            try:
                router.workers()
            except RouterApiError as exc:
                raise RouterApiError(str(exc), where=f"fleets[{n}].router") from exc
            except EngineUnavailableError:
                continue
