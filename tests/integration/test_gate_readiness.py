"""The gate in its Kubernetes form: a new engine pod's ``prewarm gate`` sidecar (the command, in
its own process) answers ``/ready`` 503 until the fleet's hot set is verified on the engine,
then 200. The test plays the kubelet (a probe every second, as a ``readinessProbe`` would) and
the endpoints controller (the replica joins the real ``vllm-router`` only once Ready) while
paced users send every template without pause: no request reaches the new replica cold."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from jobs.api import build_api
from jobs.embedded import free_port, serve_app
from tasks.adapters import gate_state
from tests.integration.gate_rig import (
    GatedRig,
    Users,
    balancing_on_load,
    landed_on,
    write_config,
)

pytestmark = pytest.mark.integration

TEMPLATES = 8


def _prewarm() -> str:
    return shutil.which("prewarm") or str(Path(sys.executable).with_name("prewarm"))


def _probe(url: str) -> int:
    try:
        return httpx.get(url, timeout=1).status_code
    except httpx.TransportError:
        return 0  # (not listening yet: a failed probe)


def _watch(url: str, seen: list[int], stop: threading.Event) -> None:
    """Every answer of ``url`` every 20 ms until ``stop``."""
    while not stop.is_set():
        seen.append(_probe(url))
        time.sleep(0.02)


def test_a_pod_is_ready_only_once_warm_and_no_request_reaches_it_cold(store, store_url, tmp_path):
    rig = balancing_on_load(
        GatedRig(tmp_path, "power_of_two", 2, store, store_url, gate_by="readiness")
    )
    assert isinstance(rig, GatedRig)
    sidecar: subprocess.Popen[bytes] | None = None
    try:
        rig.start()
        rig.traffic(TEMPLATES, 2)
        rig.observe()
        pod = rig._replica()  # the new pod's engine: up, not in the router's list
        rig.replicas.append(pod)
        config = write_config(rig, tmp_path / "prewarm.toml", [r.url for r in rig.replicas])
        port = free_port()
        env = {**os.environ, "PREWARM_CONFIG": str(config)}
        users = Users(rig, TEMPLATES).start()
        with (tmp_path / "sidecar.log").open("wb") as log:
            sidecar = subprocess.Popen(
                [_prewarm(), "gate", "--replica", pod.url, "--port", str(port)],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        # what the sidecar answers between the kubelet's probes (a second apart, its warm-up
        # can begin and end between two of them on an idle machine)
        seen: list[int] = []
        watching = threading.Event()
        watcher = threading.Thread(target=_watch, args=(f"http://127.0.0.1:{port}/ready", seen,
                                                        watching), daemon=True)  # fmt: skip
        watcher.start()
        answers, joined = [], None
        until = time.monotonic() + 60
        while time.monotonic() < until and joined is None:  # the kubelet, every second
            time.sleep(1.0)
            answers.append(_probe(f"http://127.0.0.1:{port}/ready"))
            if answers[-1] == 200:  # Ready: the endpoints controller adds it
                httpx.post(f"{rig.router.url}/add_worker", params={"url": pod.url}, timeout=30)
                joined = time.time()
        watching.set()
        watcher.join(timeout=5)
        time.sleep(6.0)
        users.stop()
        with serve_app(build_api(rig.settings)) as api:
            from_api = httpx.get(f"{api}/ready/{pod.url}", timeout=10)
        (record,) = [r for r in gate_state.fleet_records(store, rig.name) if r.url == pod.url]
    finally:
        if sidecar is not None:
            sidecar.terminate()
            sidecar.wait(timeout=10)
        rig.stop()
    log_text = (tmp_path / "sidecar.log").read_text()
    assert joined is not None, (answers, log_text)
    assert answers[-1] == 200 and 200 not in answers[:-1], answers
    served = [a for a in seen if a]  # (0: not listening yet)
    assert served and served[0] == 503 and 200 in served, served  # 503 until verified, then 200
    assert from_api.status_code == 200, from_api.text
    reached = landed_on(pod, [r for r in users.requests if r.sent >= joined - 1])
    print(f"\nreadiness: probes {answers}; {len(reached)} requests reached the new pod, "
          f"{sum(not r.from_cache for r in reached)} not from cache; time to ready "
          f"{record.time_to_ready:.3f}s, stages {record.stages}")  # fmt: skip
    assert reached and all(r.from_cache for r in reached), [(r.n, r.cached, r.prompt)
                                                            for r in reached]  # fmt: skip
