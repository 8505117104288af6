"""The gate behind the real ``vllm-router``: while paced users send every template without
pause, one replica is restarted and one is added. With the gate (``gate = true``) each is out
of the router's list until its hot set is warmed and verified on it, so every request that
reaches it is served from cache; without it, the same scenario counts the requests that were
not. Both are printed per policy (``-s``)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import httpx
import pytest

from jobs.api import build_api
from jobs.cmd_status import _gate_line
from jobs.embedded import serve_app
from jobs.simulator.cache import CacheLookup
from tasks.adapters import gate_state
from tasks.adapters.plan_store import PlanStore
from tasks.services.status import loop_status
from tests.integration.fleet_rig import FleetRig
from tests.integration.gate_rig import GatedRig, balancing_on_load, scenario

pytestmark = pytest.mark.integration

TEMPLATES = 8


def _warm_up_traffic(rig: FleetRig) -> None:
    rig.traffic(TEMPLATES, 2)
    rig.observe()


def _workers(rig: FleetRig) -> list[str]:
    return sorted(httpx.get(f"{rig.router.url}/list_workers", timeout=5).json()["urls"])


@pytest.mark.parametrize("policy", ["power_of_two", "cache_aware"])
def test_no_request_reaches_a_cold_replica(policy, store, store_url, tmp_path):
    (tmp_path / "gate").mkdir()
    rig = balancing_on_load(GatedRig(tmp_path / "gate", policy, 2, store, store_url))
    try:
        rig.start()
        assert _workers(rig) == sorted(r.url for r in rig.replicas)  # admitted: nothing to warm
        _warm_up_traffic(rig)
        gated = scenario(rig, TEMPLATES, gated=True)
        states = {r.url: r.state.value for r in gate_state.fleet_records(store, rig.name)}
        assert _workers(rig) == sorted(r.url for r in rig.replicas)
    finally:
        rig.stop()
    store.flushdb()
    (tmp_path / "base").mkdir()
    base = balancing_on_load(FleetRig(tmp_path / "base", policy, 2, store, store_url))
    try:
        base.start()
        _warm_up_traffic(base)
        ungated = scenario(base, TEMPLATES, gated=False)
    finally:
        base.stop()
    print(f"\n{policy}: with the gate {gated}\n{policy}: without {ungated}")
    assert set(states.values()) == {"ready"}, states
    assert gated["restarted"]["reached"] > 0 and gated["added"]["reached"] > 0, gated
    assert gated["restarted"]["cold"] == 0 and gated["added"]["cold"] == 0, gated


def test_a_replica_never_verified_is_admitted_cold_at_the_deadline(
    store, store_url, tmp_path, caplog
):
    """Its cache disabled, a restarted replica's warm-up is never verified: at the deadline it
    is admitted anyway, with a WARNING, the counter, a degraded status and Ready."""
    rig = GatedRig(tmp_path, "round_robin", 2, store, store_url, deadline_s=3.0)
    try:
        rig.start()
        _warm_up_traffic(rig)
        replica = rig.replicas[0]
        replica.restart()
        assert replica.engine is not None
        replica.engine.cache.lookup = lambda chain: CacheLookup(0, len(chain))  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="tasks.services.gate"):
            waiting = False
            until = time.monotonic() + 20
            while time.monotonic() < until:
                rig.poll()
                record = gate_state.load(store, rig.name, rig.replica_name(replica))
                assert record is not None
                waiting = waiting or (record.state.value == "waiting" and
                                      replica.url not in _workers(rig))  # fmt: skip
                if record.admits:
                    break
                time.sleep(0.2)
        assert waiting and record.state.value == "admitted_cold", record
        assert "admitted cold" in caplog.text
        assert replica.url in _workers(rig)
        status = loop_status(rig.settings, store)
        assert not status["healthy"]
        assert [p["subject"] for p in status["problems"] if p["kind"] == "gate_admitted_cold"] == [
            rig.replica_name(replica)
        ]
        (row,) = [g for g in status["gate"] if g["url"] == replica.url]
        assert row["state"] == "admitted_cold"
        line = _gate_line(row)
        assert line.startswith(f"gate fleet/{rig.replica_name(replica)}: admitted_cold ready in ")
        assert "deadline of 3s passed" in line
        with serve_app(build_api(rig.settings)) as api:
            scrape = httpx.get(f"{api}/metrics", timeout=10).text
            ready = httpx.get(f"{api}/ready/{rig.replica_name(replica)}", timeout=10)
            unknown = httpx.get(f"{api}/ready/http://10.9.9.9:1", timeout=10)
    finally:
        rig.stop()
    assert 'prewarm_gate_admitted_cold_total{fleet="fleet"} 1.0' in scrape
    assert 'prewarm_gate_time_to_ready_seconds_count{fleet="fleet"}' in scrape
    name = rig.replica_name(replica)
    assert (
        f'prewarm_gate_replica{{engine="{name}",fleet="fleet",state="admitted_cold"}} 1.0' in scrape
    )
    assert 'prewarm_gate_waiting{fleet="fleet"} 0.0' in scrape
    assert (ready.status_code, unknown.status_code) == (200, 503)


def test_sglang_router_admits_a_gated_replica_only_once_warm(store, store_url, tmp_path):
    """The same gate behind the real ``sglang-router`` 0.3.2: its workers added with
    ``POST /workers`` and removed with ``DELETE /workers/{id}``."""
    rig = GatedRig(tmp_path, "round_robin", 2, store, store_url, router="sglang-router")

    def workers() -> list[str]:
        listed = httpx.get(f"{rig.router.url}/workers", timeout=5).json()["workers"]
        return sorted(w["url"] for w in listed)

    try:
        rig.start()
        assert workers() == sorted(r.url for r in rig.replicas)
        _warm_up_traffic(rig)
        gated = scenario(rig, TEMPLATES, gated=True)
        states = {r.url: r.state.value for r in gate_state.fleet_records(store, rig.name)}
        assert workers() == sorted(r.url for r in rig.replicas)
    finally:
        rig.stop()
    print(f"\nsglang-router round_robin: with the gate {gated}")
    assert set(states.values()) == {"ready"}, states
    assert gated["restarted"]["reached"] > 0 and gated["added"]["reached"] > 0, gated
    assert gated["restarted"]["cold"] == 0 and gated["added"]["cold"] == 0, gated


def test_a_gated_start_up_plans_from_what_every_replica_served_until_now(
    store, store_url, tmp_path
):
    """No window tick has read the users' history yet: a restarted replica's gated warm-up
    reads its siblings' logs first, so its hot set has every template the fleet served — not
    only those of the last tick (which warmed 5 of 8 under the services, and users missed 3)."""
    rig = GatedRig(tmp_path, "cache_aware", 2, store, store_url)
    try:
        rig.start()
        rig.traffic(TEMPLATES, 2)  # (each template's users on one replica: cache_aware)
        served = {r: sum(f"Template {n}. " in Path(r.config.log_file).read_text()
                         for n in range(TEMPLATES)) for r in rig.replicas}  # fmt: skip
        replica = min(rig.replicas, key=served.__getitem__)  # the other served the most
        replica.restart()
        until = time.monotonic() + 30
        record = None
        while time.monotonic() < until:
            rig.poll()
            record = gate_state.load(store, rig.name, rig.replica_name(replica))
            if record is not None and record.admits and record.plan_id is not None:
                break
            time.sleep(0.1)
    finally:
        rig.stop()
    assert record is not None and record.state.value == "ready", record
    assert record.plan_id is not None, f"nothing warmed: {record.why}"
    plans = PlanStore(store)
    texts = [
        item.text or json.dumps(item.messages)
        for batch in range(plans.report(record.plan_id)["batches"])
        for item in plans.load_batch(record.plan_id, batch)[0]
    ]
    warmed = {n for n in range(TEMPLATES) for text in texts if f"Template {n}. " in text}
    assert warmed == set(range(TEMPLATES)), (warmed, record.why)
