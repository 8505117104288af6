"""The gate's pure parts: episodes (a new process waits), the deadline, the readiness answer;
each router kind's worker edits as it serves them; a gated fleet whose router's list would be
the source of truth is refused."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import ValidationError

from pipeline.gate import (
    GateRecord,
    GateState,
    admitted,
    is_new_process,
    new_episode,
    past_deadline,
    readiness,
)
from tasks.adapters.router_client import RouterClient
from tasks.settings.fleets import FleetSettings, ReplicaSettings


def _waiting(now: float = 100.0) -> GateRecord:
    return new_episode("f", "f-a-1", "http://a:1", now, start_time=50.0)


def test_a_new_process_begins_an_episode():
    record = _waiting()
    assert is_new_process(None, 50.0)
    assert not is_new_process(record, 50.0)
    assert is_new_process(record, 51.0)  # restarted between two looks
    assert is_new_process(GateRecord("f", "e", "u", GateState.DOWN, 1.0, 50.0), 50.0)


def test_readiness_is_503_until_admitted_and_200_after_the_deadline():
    record = _waiting()
    assert readiness(None, 100.0, 60.0)[0] == 503
    assert readiness(record, 130.0, 60.0)[0] == 503
    assert not past_deadline(record, 159.0, 60.0)
    assert readiness(record, 160.0, 60.0) == (200, "admitted_cold: deadline of 60s passed")
    ready = admitted(record.with_stage("planning", 0.1), GateState.READY, 100.4, "held")
    assert readiness(ready, 100.5, 60.0) == (200, "ready")
    assert ready.time_to_ready == pytest.approx(0.4)
    assert GateRecord.from_dict(json.loads(json.dumps(ready.to_dict()))) == ready


def test_prewarm_part_leaves_the_engines_warm_out():
    record = _waiting().with_stage("detection", 0.01).with_stage("warm", 2.0)
    record = record.with_stage("verification", 0.02).with_stage("verification", 0.01)
    assert record.prewarm_part() == pytest.approx(0.04)


def _recorder(kind: str, seen: list[tuple[str, str, str]]) -> RouterClient:
    workers = {"workers": [{"id": "9f1c", "url": "http://a:1"}]}

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.url.query.decode()
                     + request.content.decode()))  # fmt: skip
        if request.method == "GET":
            return httpx.Response(200, json=workers)
        return httpx.Response(202 if kind == "sglang-router" else 200, json={})

    fleet = FleetSettings(name="f", router_url="http://router:1", router=kind,  # type: ignore[arg-type]
                          model="m", replicas_from="router")  # fmt: skip
    return RouterClient(fleet, transport=httpx.MockTransport(answer))


def test_each_router_kind_adds_and_removes_workers_its_own_way():
    seen: list[tuple[str, str, str]] = []
    vllm = _recorder("vllm-router", seen)
    vllm.add_worker("http://a:1")
    vllm.remove_worker("http://a:1")
    assert seen == [("POST", "/add_worker", "url=http%3A%2F%2Fa%3A1"),
                    ("POST", "/remove_worker", "url=http%3A%2F%2Fa%3A1")]  # fmt: skip
    seen.clear()
    sglang = _recorder("sglang-router", seen)
    sglang.add_worker("http://a:1")
    sglang.remove_worker("http://a:1")
    sglang.remove_worker("http://b:2")  # not listed: left as it is
    assert [s[:2] for s in seen] == [("POST", "/workers"), ("GET", "/workers"),
                                     ("DELETE", "/workers/9f1c"), ("GET", "/workers")]  # fmt: skip
    assert json.loads(seen[0][2]) == {"url": "http://a:1"}


def test_a_gated_fleet_does_not_take_its_replicas_from_the_router_it_edits():
    with pytest.raises(ValidationError, match="gate = true edits the router's worker list"):
        FleetSettings(name="f", router_url="http://r:1", model="m", replicas_from="router",
                      gate=True)  # fmt: skip
    readiness_only = FleetSettings(
        name="f", router_url="http://r:1", model="m", replicas_from="router", gate=True,
        gate_by="readiness",
    )  # fmt: skip
    assert readiness_only.gate
    listed = FleetSettings(name="f", router_url="http://r:1", model="m", gate=True,
                           replicas=(ReplicaSettings(url="http://a:1"),))  # fmt: skip
    assert listed.gate_deadline_s == 120.0


def test_the_sidecar_refuses_a_bad_option_or_an_ungated_replica_in_one_line(
    tmp_path, monkeypatch, capsys
):
    from jobs.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["gate", "--replica", "http://a:1", "--every", "0"])
    assert exited.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    config = tmp_path / "prewarm.toml"
    config.write_text('[[fleets]]\nname = "f"\nrouter_url = "http://r:1"\nmodel = "m"\n'
                      '[[fleets.replicas]]\nurl = "http://a:1"\n')  # fmt: skip
    monkeypatch.setenv("PREWARM_CONFIG", str(config))
    with pytest.raises(SystemExit) as exited:
        main(["gate", "--replica", "http://a:1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1 and "not gated" in err[0], err
