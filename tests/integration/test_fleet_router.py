"""A fleet behind the real ``vllm-router``: replicas taken from the router's worker list become
engines; one the router adds is new to the watch (which warms it), one it removes is dropped;
``prewarm status`` and ``/metrics`` show the fleet replica by replica."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from jobs.api import build_api
from jobs.cmd_watch import Watcher
from jobs.embedded import serve_app
from jobs.simulator import SimulatorServer
from tasks.adapters import fleet_state
from tasks.services.fleets import fleet_settings, look_at_fleets
from tasks.services.status import loop_status
from tasks.settings import Settings
from tasks.settings.fleets import FleetSettings
from tests.integration.router import RouterProcess, simulator_replicas

pytestmark = pytest.mark.integration


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[SimulatorServer]]:
    with simulator_replicas(tmp_path, 3) as servers:
        yield servers


def _settings(router: RouterProcess, store_url: str, broker_url: str, tmp_path: Path) -> Settings:
    fleet = FleetSettings(
        name="chat", router_url=router.url, policy="round_robin", model="sim-llm",
        replica_kind="simulator", replicas_from="router", log=str(tmp_path / "{port}.log"),
    )  # fmt: skip
    return Settings(redis_url=broker_url, store_url=store_url, data_dir=tmp_path, fleets=(fleet,))


def test_replicas_follow_the_routers_worker_list(replicas, store, store_url, broker_url, tmp_path):
    urls = [r.url for r in replicas]
    with RouterProcess(urls[:2], "round_robin", tmp_path / "router.log") as router:
        settings = _settings(router, store_url, broker_url, tmp_path)
        assert fleet_settings(settings, store).engines == ()  # never looked yet
        current, changes = look_at_fleets(settings, store)
        names = [f"chat-127.0.0.1-{r.port}" for r in replicas]
        assert [e.name for e in current.replicas_of("chat")] == sorted(names[:2])
        assert changes == [{"fleet": "chat", "router_up": True, "router_restarted": False,
                            "added": sorted(names[:2]), "removed": []}]  # fmt: skip
        assert current.sources_of(names[0])[0].path == str(tmp_path / f"{replicas[0].port}.log")
        added = httpx.post(f"{router.url}/add_worker", params={"url": urls[2]}, timeout=30)
        assert added.status_code == 200
        removed = httpx.post(f"{router.url}/remove_worker", params={"url": urls[0]}, timeout=30)
        assert removed.status_code == 200
        fired: list[tuple[str, str]] = []
        watcher = Watcher(settings, store, warm=lambda e, k: fired.append((e, k)) or {})
        watcher.poll()
        assert sorted(e.name for e in watcher.settings.engines) == sorted(names[1:])
        assert (names[2], "replica_ready") in fired  # the added replica, warmed at once
        assert not any(engine == names[0] for engine, _ in fired)
        status = loop_status(settings, store)
        (fleet,) = status["fleets"]
        assert (fleet["policy"], fleet["road"]) == ("round_robin", "every-replica")
        assert [r["engine"] for r in fleet["replicas"]] == sorted(names[1:])
        assert {e["engine"]: e["fleet"] for e in status["engines"]} == dict.fromkeys(
            sorted(names[1:]), "chat"
        )
        with serve_app(build_api(settings)) as api:
            scrape = httpx.get(f"{api}/metrics").text
    for name, value in ((names[0], "0.0"), (names[1], "1.0"), (names[2], "1.0")):
        series = (f'prewarm_fleet_replica{{engine="{name}",fleet="chat",policy="round_robin",'
                  f'road="every-replica"}} {value}')  # fmt: skip
        assert series in scrape
    assert 'prewarm_fleet_router_up{fleet="chat"} 1.0' in scrape
    assert f'prewarm_engine_up{{engine="{names[2]}"}} 1.0' in scrape


def test_replicas_found_by_dns_follow_the_names_addresses(replicas, store, store_url, tmp_path):
    """``localhost`` resolved by this machine's resolver: its address is the fleet's replica,
    new to the watch and warmed at once; when the name stops resolving to it, it is dropped."""
    port = replicas[0].port
    with RouterProcess([replicas[0].url], "kv_aware", tmp_path / "router.log") as router:
        fleet = FleetSettings(
            name="k8s", router_url=router.url, policy="kv_aware", model="sim-llm",
            replica_kind="simulator", replicas_from="dns", replicas_dns=f"localhost:{port}",
        )  # fmt: skip
        settings = Settings(store_url=store_url, data_dir=tmp_path, fleets=(fleet,))
        fired: list[tuple[str, str]] = []
        watcher = Watcher(settings, store, warm=lambda e, k: fired.append((e, k)) or {})
        watcher.poll()
        name = f"k8s-127.0.0.1-{port}"
        assert [e.url for e in watcher.settings.replicas_of("k8s")] == [replicas[0].url]
        assert fired == [(name, "replica_ready")]
        moved = [(0, 0, 0, "", ("127.0.0.2", port))]  # the pod moved: another address
        current, changes = look_at_fleets(settings, store, resolve=lambda *a, **k: moved)
        assert [e.name for e in current.replicas_of("k8s")] == [f"k8s-127.0.0.2-{port}"]
        assert (changes[0]["added"], changes[0]["removed"]) == ([f"k8s-127.0.0.2-{port}"], [name])


def test_a_replica_down_is_not_the_router_restarting(replicas, store, store_url, broker_url,
                                                     tmp_path):  # fmt: skip
    """While a replica is down the router answers ``/health`` with 503 naming it; the router is
    up all along, and a rolling restart of its replicas is no router restart."""
    with RouterProcess([r.url for r in replicas[:2]], "cache_aware", tmp_path / "r.log") as router:
        settings = _settings(router, store_url, broker_url, tmp_path)
        look_at_fleets(settings, store)
        replicas[0].stop()
        health = lambda: httpx.get(f"{router.url}/health", timeout=5)  # noqa: E731 (polled below)
        for _ in range(100):  # the router checks its workers every second
            if health().status_code == 503:
                break
            time.sleep(0.1)
        assert health().status_code == 503 and replicas[0].url in health().text
        _, changes = look_at_fleets(settings, store)
        replicas[0].start()
        _, after = look_at_fleets(settings, store)
    assert fleet_state.router_seen(store, "chat")["up"] is True
    assert [c for c in changes + after if c["router_restarted"] or not c["router_up"]] == []
