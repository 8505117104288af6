"""The KV-event source end to end on the simulator: follow, restart, restore, verify by events.

A real Redis, a real Celery worker on a queue of its own, the simulator publishing vLLM's wire
format over real ZMQ sockets. Only the event stream tells prewarm what the engine held (the
simulator's log is never read). After the restart, the restore plan primes token ids, and its
batches are verified by the new engine's ``BlockStored`` events: no probe request is sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from jobs.embedded import WorkerProcess, free_port
from jobs.simulator import LatencyModel, SimulatorConfig, SimulatorServer
from tasks.adapters import telemetry
from tasks.adapters.kv_state import KvStateStore, read_counts
from tasks.services.kv_follow import FollowReport, KvSource, follow
from tasks.settings import load_settings
from tasks.warm_tasks import batch_results, submitter, wait_plan
from tests.conftest import BROKER_URL, STORE_URL, worker_env

pytestmark = pytest.mark.integration
QUEUE = "kv-restore-test"
HEADS = [" ".join(f"head{t} word{i} system rule{i % 7}" for i in range(40)) for t in range(3)]


@pytest.fixture
def sim() -> Iterator[SimulatorServer]:
    config = SimulatorConfig(
        latency=LatencyModel(0.2, 0.0, 1.0),
        kv_events_endpoint=f"tcp://127.0.0.1:{free_port()}",
        kv_replay_endpoint=f"tcp://127.0.0.1:{free_port()}",
    )  # fmt: skip
    with SimulatorServer(config) as server:
        yield server


def ask(client: httpx.Client, head: int, question: str) -> dict:
    body = {"model": "sim-llm", "prompt": f"{HEADS[head]} Question: {question}", "max_tokens": 1}
    answer = client.post("/v1/completions", json=body)
    answer.raise_for_status()
    return answer.json()["usage"]


def question(n: int) -> str:
    """A question of 24 words: it completes a block of its own (a question shorter than the
    partial block after a head is stored by no event: its request publishes nothing)."""
    return " ".join(f"q{n}w{i}" for i in range(24))


def wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout_s:.0f}s")


def test_a_restarted_engine_is_restored_from_its_events_alone(
    sim, tmp_path: Path, store_url, celery_app_configured
):
    config = tmp_path / "prewarm.toml"
    engine = f'name = "sim"\nurl = "{sim.url}"\nmodel = "sim-llm"\nkind = "simulator"\n'
    config.write_text(f'wal_lease_s = 5\ndata_dir = "{tmp_path / "data"}"\n\n[[engines]]\n{engine}')
    env = {"PREWARM_REDIS_URL": BROKER_URL, "PREWARM_STORE_URL": STORE_URL}
    settings = load_settings(environ=env, config_path=config)
    store = redis.Redis.from_url(STORE_URL)
    source = KvSource("sim", sim.config.kv_events_endpoint or "", sim.config.kv_replay_endpoint)
    stop, report = threading.Event(), FollowReport()

    def run() -> None:
        submit = submitter(settings, queue=QUEUE)
        report.__dict__.update(follow(source, settings, store, submit=submit, stop=stop,
                                      probe_s=1.0).__dict__)  # fmt: skip

    worker = WorkerProcess(config, tmp_path / "worker.log", env=worker_env(), queues=QUEUE)
    follower = threading.Thread(target=run, daemon=True)
    follower.start()
    state = KvStateStore(store, "sim")
    try:
        worker.wait_ready()
        wait_for(state.alive, 20, "follower alive")
        with httpx.Client(base_url=sim.url, timeout=10) as client:
            for n in range(12):  # three heads, used 5, 4 and 3 times, each with its own question
                ask(client, n % 3 if n < 9 else 0, question(n))
        wait_for(lambda: int(state.status().get("batches", 0)) >= 12, 20, "history seen")
        sim.restart()
        plan_id = wait_for(lambda: state.status().get("last_restore"), 60, "restore submitted")
        done = wait_plan(plan_id, timeout_s=60, settings=settings)
        assert done["items"] >= 3 and done["items_ok"] == done["items"], done
        results = batch_results(plan_id, settings=settings)
        # verified by the engine's events: the only engine requests are the priming ones
        assert sum(r["engine_requests"] for r in results) == len(results)
        with httpx.Client(base_url=sim.url, timeout=10) as client:
            first_uses = [ask(client, head, question(100 + head)) for head in range(3)]
        for usage in first_uses:
            assert usage["prompt_tokens_details"]["cached_tokens"] >= 160, first_uses
    finally:
        stop.set()
        follower.join(15)
        worker.stop()
    assert report.resets >= 1 and report.restores == [plan_id]
    # the restore is counted with its own reason by the real telemetry writer
    plans = dict(telemetry.read_series(store)["prewarm_plans_total"])
    assert plans == {("sim", "replica"): 1.0}, plans
    counts = read_counts(tmp_path / "data", "sim")
    assert counts is not None and counts["stored"].sum() > 0 and counts["requests"].max() >= 5
