"""The gate as an operator runs it: the compose services' own commands (workers and beat, whose
``prewarm.events.gate_watch`` looks every second), nothing typed, the real ``vllm-router``
(``power_of_two``, and ``cache_aware`` balancing on load) in front of two simulator replicas,
and a third listed in the settings that comes up mid-run (a scale-out). While paced users send
every template without pause, replica 0 is restarted and the third comes up.

With the gate (replicas listed, ``gate = true``), every request that reaches the restarted or the
added replica after it came back is served from cache; without it (replicas from the router,
warmed by beat's replica watch, the third added to the router as it comes up) the same scenario
counts the requests that were not. Prints both per policy (``-s``). The replicas are the engine
SIMULATOR. About three minutes a case: behind the ``slow`` marker."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from jobs.embedded import free_port
from jobs.simulator import SimulatorConfig, SimulatorServer
from tasks.adapters import gate_state
from tasks.settings import load_settings
from tests.integration.fleet_rig import Fleet
from tests.integration.gate_rig import BALANCE_ON_LOAD, Users, cold_share, landed_on
from tests.integration.test_compose import LocalStack
from tests.integration.test_fleet_matrix import SERVICES

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

TEMPLATES, USES = 8, 2
#: how long a gated replica may take from coming up to Ready on this loaded machine (beat's
#: look every second, the warm worker's plan, the post-plan check)
READY_WITHIN_S = 90.0
#: the ungated replica watch looks every second too; its warm-up is given as long as the gate
UNGATED_WAIT_S = 20.0
#: once in, users are given this long to reach a replica eight times (a router balancing on
#: load sends it a user only when the others are busier)
REACHED_WITHIN_S = 20.0


def settings_text(fleet: Fleet, gated: bool, urls: list[str]) -> str:
    """The settings file: the fleet gated (its replicas listed) or not (taken from the router),
    a one-second replica watch and gate look."""
    entry = fleet.fleet_settings().model_dump(exclude_none=True, exclude_defaults=True)
    lines = ["[schedule]", "window_s = 300", "replica_watch_s = 1", "gate_watch_s = 1", ""]
    if gated:
        entry.update(replicas_from="list", gate=True, gate_deadline_s=READY_WITHIN_S * 2)
    lines += ["[[fleets]]", *(f"{k} = {json.dumps(v)}" for k, v in entry.items()), ""]
    for url in urls if gated else []:
        lines += ["[[fleets.replicas]]", f"url = {json.dumps(url)}", ""]
    return "\n".join(lines)


def future_replica(fleet: Fleet) -> SimulatorServer:
    """A replica whose address is known before it runs (listed ahead, as a StatefulSet's)."""
    port = free_port()
    config = SimulatorConfig(
        log_file=fleet.tmp / f"replica-{port}.log", capacity_blocks=fleet.capacity_blocks
    )
    return SimulatorServer(config, port=port)


def router_workers(fleet: Fleet) -> list[str]:
    return sorted(httpx.get(f"{fleet.router.url}/list_workers", timeout=5).json()["urls"])


def wait_admitted(
    store: redis.Redis, fleet: Fleet, replica: SimulatorServer, gated: bool, users: Users
) -> None:
    """Until the gate admitted ``replica`` again after it came up (gated), or for as long as
    the replica watch is given to warm it (ungated); then until users reached it."""
    up, record = time.time(), None
    deadline = time.monotonic() + (UNGATED_WAIT_S if not gated else READY_WITHIN_S)
    while gated and time.monotonic() < deadline:
        record = gate_state.load(store, fleet.name, fleet.replica_name(replica))
        admitted = record is not None and record.admits and (record.admitted or 0) > up
        if admitted and replica.url in router_workers(fleet):
            break
        time.sleep(0.5)
    else:
        assert not gated, f"{replica.url} not admitted in {READY_WITHIN_S}s: {record}"
    reached = time.monotonic() + REACHED_WITHIN_S
    while time.monotonic() < reached:
        if len(landed_on(replica, [r for r in users.requests if r.sent > up])) >= 8:
            return
        time.sleep(0.5)


def scenario(
    fleet: Fleet, stack: LocalStack, added: SimulatorServer, gated: bool
) -> dict[str, dict[str, Any]]:
    store = redis.Redis.from_url(load_settings(stack.services["beat"].env).store_redis_url)
    fleet.traffic(TEMPLATES, USES)
    users = Users(fleet, TEMPLATES).start()
    try:
        time.sleep(2.0)
        restarted = fleet.replicas[0]
        restarted.stop()
        time.sleep(1.0)
        mark = len(users.requests)
        restarted.start()
        wait_admitted(store, fleet, restarted, gated, users)
        added.start()
        fleet.replicas.append(added)
        if not gated:  # the operator's scale-out: the router learns of it at once
            httpx.post(f"{fleet.router.url}/add_worker", params={"url": added.url}, timeout=60)
        wait_admitted(store, fleet, added, gated, users)
    finally:
        users.stop()
    after = users.requests[mark:]
    out: dict[str, dict[str, Any]] = {}
    for name, replica in (("restarted", restarted), ("added", added)):
        reached, cold = cold_share([replica], after)
        out[name] = {"reached": reached, "cold": cold}
        record = gate_state.load(store, fleet.name, fleet.replica_name(replica))
        if cold and record is not None:  # when, against its admission, and what it held
            out[name]["cold_at"] = [
                (r.n, round(r.sent - (record.admitted or 0), 2), r.cached, r.prompt)
                for r in landed_on(replica, after) if not r.from_cache
            ]  # fmt: skip
            out[name]["gate"] = (record.state.value, record.why, record.stages)
    if gated:
        states = {r.url: r.state.value for r in gate_state.fleet_records(store, fleet.name)}
        assert set(states.values()) == {"ready"}, states
    return out


def run_case(tmp_path: Path, policy: str, gated: bool) -> dict[str, dict[str, Any]]:
    fleet = Fleet(tmp_path / "fleet", policy, 2)
    if policy == "cache_aware":
        fleet.router.extra = (*fleet.router.extra, *BALANCE_ON_LOAD)
    added = future_replica(fleet)
    stack = LocalStack(tmp_path / "stack", only=SERVICES)
    try:
        fleet.start_router()
        urls = [r.url for r in fleet.replicas] + [added.url]
        stack.config_path.write_text(settings_text(fleet, gated, urls))
        stack.start()
        stack.wait_healthy()
        return scenario(fleet, stack, added, gated)
    finally:
        stack.stop()
        fleet.stop()
        added.stop()


@pytest.mark.parametrize("policy", ["power_of_two", "cache_aware"])
def test_gated_replicas_take_users_only_once_warm_under_the_services(policy, tmp_path: Path):
    for case in ("gate", "base"):
        (tmp_path / case / "fleet").mkdir(parents=True)
        (tmp_path / case / "stack").mkdir()
    gated = run_case(tmp_path / "gate", policy, gated=True)
    print(f"\n{policy} under the services: with the gate {gated}", flush=True)
    ungated = run_case(tmp_path / "base", policy, gated=False)
    print(f"{policy} under the services: without the gate {ungated}", flush=True)
    assert gated["restarted"]["reached"] > 0 and gated["added"]["reached"] > 0, gated
    assert gated["restarted"]["cold"] == 0 and gated["added"]["cold"] == 0, gated
