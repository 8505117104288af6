"""Nothing silently green: replicas a fleet cannot find, its router down and a plan with items
not verified each make ``prewarm status`` exit 1 with a line saying since when, ``/health`` say
degraded, and set a metric — against routers on loopback (a stub answering as sglang-router
0.3.2 does to ``/list_workers``, and the real ``vllm-router``) and simulator replicas."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from jobs.api import build_api, health_payload
from jobs.embedded import serve_app
from tasks.services.fleets import look_at_fleets
from tasks.settings import Settings, current_settings
from tasks.settings.fleets import FleetSettings, ReplicaSettings
from tests.integration.fleet_rig import FleetRig

pytestmark = pytest.mark.integration


class StubRouter:
    """A router on loopback: ``/health`` 200, ``/list_workers`` answering ``status`` and
    ``body`` (as the test sets them); ``stop()`` takes it down (connection refused)."""

    def __init__(self) -> None:
        self.status, self.body = 404, "Not Found"
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code, text = (200, "OK") if self.path == "/health" else (stub.status, stub.body)
                data = text.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def lists(self, status: int, body: str) -> None:
        self.status, self.body = status, body

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub() -> Iterator[StubRouter]:
    router = StubRouter()
    yield router
    router.stop()


def _settings(router_url: str, store_url: str, tmp_path: Path, replicas_from: str) -> Settings:
    fleet = FleetSettings(
        name="chat", router_url=router_url, policy="cache_aware", model="sim-llm",
        replica_kind="simulator", replicas_from=replicas_from,  # type: ignore[arg-type]
        replicas=() if replicas_from == "router" else (ReplicaSettings(url="http://127.0.0.1:9"),),
    )  # fmt: skip
    return Settings(redis_url=store_url, store_url=store_url, data_dir=tmp_path, fleets=(fleet,))


@contextmanager
def _configured(settings: Settings, tmp_path: Path, monkeypatch) -> Iterator[None]:
    """``settings`` as the CLI reads them (a TOML file named by ``PREWARM_CONFIG``)."""
    path = tmp_path / "prewarm.json.toml"
    fleets = [f.model_dump(exclude_none=True, mode="json") for f in settings.fleets]
    lines = [f'data_dir = "{settings.data_dir}"']
    for fleet in fleets:
        lines.append("[[fleets]]")
        for key, value in fleet.items():
            if key == "replicas":
                continue
            lines.append(f"{key} = {json.dumps(value)}")
        for replica in fleet.get("replicas", ()):
            lines.append("[[fleets.replicas]]")
            lines.append(f"url = {json.dumps(replica['url'])}")
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setenv("PREWARM_CONFIG", str(path))
    monkeypatch.setenv("PREWARM_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("PREWARM_STORE_URL", settings.store_redis_url)
    current_settings.cache_clear()
    try:
        yield
    finally:
        current_settings.cache_clear()


def _status(capsys) -> tuple[int, str]:
    """``prewarm status`` in this process: its exit code and output."""
    from jobs.cli import main

    try:
        main(["status"])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().out


def _problem_lines(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith("problem:")]


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _scrape(settings: Settings) -> str:
    with serve_app(build_api(settings)) as api:
        return httpx.get(f"{api}/metrics", timeout=30).text


def test_replicas_the_router_does_not_list_are_a_problem_since_first_seen(
    stub, store, store_url, tmp_path, monkeypatch, capsys, caplog
):
    """sglang-router 0.3.2 answers ``/list_workers`` with 404: no replica is found, which is
    said once at WARNING (not at every look), by ``prewarm status`` (exit 1, since when), by
    ``/health`` (degraded) and by ``prewarm_fleet_replicas_undiscoverable``."""
    settings = _settings(stub.url, store_url, tmp_path, "router")
    first = time.time() - 120
    with caplog.at_level(logging.INFO, logger="tasks.services.fleets"):
        for look in range(3):
            look_at_fleets(settings, store, now=first + 5 * look)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "HTTP 404" in warnings[0].getMessage(), caplog.records
    with _configured(settings, tmp_path, monkeypatch):
        code, out = _status(capsys)
    (line,) = _problem_lines(out)
    assert code == 1 and "loop: UNHEALTHY" in out
    assert line.startswith("problem: replicas_undiscoverable chat:") and "HTTP 404" in line
    assert f"since {_utc(first)}" in line, line
    status, body = health_payload(settings)
    assert (status, body["status"]) == (200, "degraded")
    assert "replicas_undiscoverable chat" in body["problems"][0]
    assert 'prewarm_fleet_replicas_undiscoverable{fleet="chat"} 1.0' in _scrape(settings)
    # an empty list, then a body that is no list: still the same problem, since the first look
    for answer in ('{"urls": []}', '{"workers": [{"url": "http://127.0.0.1:9"}]}'):
        stub.lists(200, answer)
        look_at_fleets(settings, store, now=first + 30)
        with _configured(settings, tmp_path, monkeypatch):
            code, out = _status(capsys)
        (line,) = _problem_lines(out)
        assert code == 1 and f"since {_utc(first)}" in line, line
    # the router lists its workers: the problem goes, and with it the metric
    stub.lists(200, '{"urls": ["http://127.0.0.1:9"]}')
    look_at_fleets(settings, store, now=first + 60)
    with _configured(settings, tmp_path, monkeypatch):
        code, out = _status(capsys)
    assert (code, _problem_lines(out)) == (0, []), out
    assert health_payload(settings)[1]["status"] == "ok"
    assert 'prewarm_fleet_replicas_undiscoverable{fleet="chat"} 0.0' in _scrape(settings)


def test_a_router_down_is_a_problem_since_first_seen(
    stub, store, store_url, tmp_path, monkeypatch, capsys
):
    """A router that does not answer (connection refused): the road through it fails."""
    settings = _settings(stub.url, store_url, tmp_path, "list")
    first = time.time() - 300
    look_at_fleets(settings, store, now=first - 10)  # up
    stub.stop()
    look_at_fleets(settings, store, now=first)
    look_at_fleets(settings, store, now=first + 10)
    with _configured(settings, tmp_path, monkeypatch):
        code, out = _status(capsys)
    (line,) = _problem_lines(out)
    assert code == 1, out
    assert line.startswith(f"problem: router_down chat: router {stub.url} does not answer")
    assert f"since {_utc(first)}" in line, line
    status, body = health_payload(settings)
    assert (status, body["status"]) == (200, "degraded") and "router_down chat" in body["problems"][
        0
    ]
    assert 'prewarm_fleet_router_up{fleet="chat"} 0.0' in _scrape(settings)


def test_a_plan_with_items_not_verified_is_a_problem(
    store, store_url, tmp_path, monkeypatch, capsys
):
    """An engine's last plan whose report has failed items (here: primes through a router that
    went down) is a problem until a plan of the engine verifies every item."""
    rig = FleetRig(tmp_path, "cache_aware", 1, store, store_url).start()
    try:
        rig.traffic(3, uses=2)
        rig.observe()
        (engine,) = [e.name for e in rig.watcher.settings.engines]
        rig.router.stop()
        outcome = rig._warm(engine, "cli")
        settings = rig.settings
        with _configured(settings, tmp_path, monkeypatch):
            code, out = _status(capsys)
        lines = [x for x in _problem_lines(out) if "plan_unverified" in x]
        assert code == 1 and len(lines) == 1, out
        planned = outcome["planned"]
        assert (
            planned > 0 and f"plan_unverified {engine}: last plan {outcome['plan_id']}" in lines[0]
        )
        assert f"{planned} of {planned} items not verified" in lines[0]
        _, body = health_payload(settings)
        assert body["status"] == "degraded" and any(
            "plan_unverified" in p for p in body["problems"]
        )
        assert f'prewarm_plan_items_unverified{{engine="{engine}"}} {float(planned)}' in _scrape(
            settings
        )
        # the router back: a plan whose every item is verified clears it
        rig.router.start()
        rig.poll()
        with _configured(settings, tmp_path, monkeypatch):
            code, out = _status(capsys)
        assert [x for x in _problem_lines(out) if "plan_unverified" in x] == [], out
        assert f'prewarm_plan_items_unverified{{engine="{engine}"}} 0.0' in _scrape(settings)
    finally:
        rig.stop()
