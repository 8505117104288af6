"""The gate as beat runs it (``prewarm.events.gate_watch``): its looks plan a restarted
replica's warm-up and send it to a real Celery worker (a queue of its own) ahead of routine
work; the replica stays out of the real ``vllm-router``'s list until a later look finds the
plan finished and its items held on the replica, then it is added."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from jobs.embedded import WorkerProcess
from pipeline.gate import GateRecord
from tasks.adapters import gate_state
from tasks.adapters.plan_store import PlanStore
from tasks.services.gate import Gatekeeper
from tasks.settings import load_settings
from tasks.warm_tasks import submitter
from tests.conftest import worker_env
from tests.integration.gate_rig import GatedRig, write_config

pytestmark = pytest.mark.integration

TEMPLATES = 8


def _workers(rig: GatedRig) -> list[str]:
    return sorted(httpx.get(f"{rig.router.url}/list_workers", timeout=5).json()["urls"])


def test_beats_gate_sends_the_warm_up_to_the_workers_and_admits_once_held(
    celery_app_configured, store, store_url, tmp_path
):
    rig = GatedRig(tmp_path, "power_of_two", 2, store, store_url)
    worker = None
    try:
        rig.start()
        rig.traffic(TEMPLATES, 2)
        rig.observe()
        config = write_config(rig, tmp_path / "prewarm.toml", [r.url for r in rig.replicas])
        settings = load_settings({}, config)
        queue = f"gate-{uuid.uuid4().hex[:8]}"
        worker = WorkerProcess(config, tmp_path / "worker.log", env=worker_env(), queues=queue,
                               pool="solo")  # fmt: skip
        worker.wait_ready(180)  # a loaded 2-core machine starts slowly
        gate = Gatekeeper(settings, store, submitter(settings, queue=queue))
        replica = rig.replicas[0]
        name = rig.replica_name(replica)
        replica.restart()
        seen: list[tuple[str, bool]] = []
        record: GateRecord | None = None
        until = time.monotonic() + 120
        while time.monotonic() < until:
            gate.look()
            record = gate_state.load(store, rig.name, name)
            assert record is not None
            seen.append((record.state.value, replica.url in _workers(rig)))
            if record.admits:
                break
            time.sleep(0.2)
        listed = _workers(rig)
        report = PlanStore(store).report(record.plan_id) if record and record.plan_id else {}
    finally:
        if worker is not None:
            worker.stop()
        rig.stop()
    assert record is not None and record.state.value == "ready", (record, seen)
    assert ("waiting", False) in seen and seen[-1] == ("ready", True), seen
    assert replica.url in listed
    assert report["state"] == "finished" and report["items_failed"] == 0, report
    assert record.stages["warm"] > 0 and record.why.endswith("items held"), record
    print(f"\ngate on the workers: time to ready {record.time_to_ready:.3f}s, {record.stages}")
