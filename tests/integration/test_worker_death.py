"""A worker killed whole — main process and pool, SIGKILL — never stalls an ordered plan.

Real Celery worker processes on the real Redis broker, the engine simulator as the engine, and
the recovery sweep run every ``schedule.wal_sweep_s`` as beat would run it. Ten times at random
points of an ordered plan the worker running its batch is killed whole: with a second worker
running, and with the only worker killed and restarted. Every plan finishes; every batch ends
with exactly one committed transaction, any earlier attempt rolled back (never mixed); batches
commit in plan order; and no plan waits longer than the WAL lease plus one sweep period before
it is resumed.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis

from jobs.embedded import WorkerProcess
from jobs.simulator import LatencyModel, SimulatorConfig, SimulatorServer
from pipeline.planner.plan import WarmPlan
from tasks.adapters.targets.base import WarmOptions
from tasks.settings import Settings
from tasks.warm_tasks import recover_and_resume, submit_plan, wait_plan
from tests.conftest import worker_env
from tests.integration.warm.conftest import (
    MODEL,
    plan_of,
    prefix_item,
    settings_for,
    write_config,
)

pytestmark = pytest.mark.integration

ROUNDS = 10
LEASE_S = 1
SWEEP_S = 1
BATCHES, PER_BATCH = 6, 2
# Redis expiry and the keeper's renewals of claim, plan and lease are milliseconds apart.
EXPIRY_MARGIN_S = 0.1
# An idle live worker taking the re-queued message and starting the batch, on a shared 2-core
# machine that ran at load 6 to 25 while this was written.
PICKUP_SLACK_S = 5.0


class Sweeper(threading.Thread):
    """The recovery sweep every ``period_s``, at a fixed rate, as beat runs it."""

    def __init__(self, settings: Settings, period_s: float) -> None:
        super().__init__(daemon=True, name="test-sweeper")
        self.settings, self.period_s = settings, period_s
        self.stopped = threading.Event()
        self.errors: list[BaseException] = []
        # Every sweep: when it began (wall clock) and the plans it resumed.
        self.sweeps: list[tuple[float, frozenset[str]]] = []

    def run(self) -> None:
        start = time.monotonic()
        tick = 0
        while not self.stopped.is_set():
            began = time.time()
            try:
                result = recover_and_resume(settings=self.settings)
            except Exception as exc:  # reported by the test, not swallowed
                self.errors.append(exc)
            else:
                self.sweeps.append((began, frozenset(r["plan"] for r in result["resumed"])))
            tick += 1
            self.stopped.wait(max(0.0, start + tick * self.period_s - time.monotonic()))


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorServer]:
    config = SimulatorConfig(model=MODEL, latency=LatencyModel(0.0, 0.0, 2.0))
    with SimulatorServer(config) as server:
        server.engine.config.faults.delay_s = 0.06  # each batch takes a moment: room to kill
        yield server


@pytest.fixture(scope="module")
def config(sim: SimulatorServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_config(tmp_path_factory.mktemp("death") / "prewarm.toml", sim.url, LEASE_S)
    path.write_text(path.read_text() + f"\n[schedule]\nwal_sweep_s = {SWEEP_S}\n")
    return path


@pytest.fixture
def sweeper(config: Path, celery_app_configured, store) -> Iterator[Sweeper]:
    settings = settings_for(config)
    sweeper = Sweeper(settings, settings.schedule.wal_sweep_s)
    sweeper.start()
    yield sweeper
    sweeper.stopped.set()
    sweeper.join(10)
    assert not sweeper.errors, sweeper.errors


class Workers:
    """Real worker processes on a queue of their own; killed whole, replaced, stopped."""

    def __init__(self, config: Path, queue: str, logs: Path) -> None:
        self.config, self.queue, self.logs = config, queue, logs
        self.alive: list[WorkerProcess] = []

    def start(self, wait: bool = True) -> WorkerProcess:
        log = self.logs / f"worker-{len(list(self.logs.iterdir()))}.log"
        worker = WorkerProcess(self.config, log, 1, env=worker_env(), queues=self.queue)
        self.alive.append(worker)
        if wait:
            worker.wait_ready(120)
        return worker

    def owning(self, pool_pid: int) -> WorkerProcess:
        """The worker whose pool process ``pool_pid`` is."""
        parent = psutil.Process(pool_pid).ppid()
        for worker in self.alive:
            if worker.proc.pid in (pool_pid, parent):
                return worker
        raise AssertionError(f"no worker runs pid {pool_pid}")

    def kill_whole(self, worker: WorkerProcess) -> None:
        main = psutil.Process(worker.proc.pid)
        for proc in [main, *main.children(recursive=True)]:
            proc.kill()  # SIGKILL: no shutdown, no ack, no requeue
        worker.proc.wait(10)
        self.alive.remove(worker)
        worker.stop()

    def stop(self) -> None:
        for worker in self.alive:
            worker.stop()


@pytest.fixture
def workers(config: Path, tmp_path: Path, broker_url: str) -> Iterator[Workers]:
    queue = f"death-{time.monotonic_ns()}"
    (tmp_path / "logs").mkdir()
    pool = Workers(config, queue, tmp_path / "logs")
    yield pool
    pool.stop()
    redis.Redis.from_url(broker_url).delete(queue)


def _claimed_batch(store: redis.Redis, plan_id: str, timeout_s: float = 10.0) -> tuple[int, int]:
    """(batch, pool pid) of the batch the plan is running right now."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for batch in range(BATCHES):
            owner = store.get(f"pw:plan:{plan_id}:claim:{batch}")
            if owner:
                return batch, int(owner.split(b"-")[0])
        time.sleep(0.005)
    raise AssertionError(f"plan {plan_id}: no batch running")


def _transactions(store: redis.Redis, plan_id: str) -> list[dict[str, str]]:
    rows = []
    for key in store.scan_iter("pw:wal:txn:*"):
        fields = {k.decode(): v.decode() for k, v in store.hgetall(key).items()}
        if fields.get("plan_id") == plan_id:
            rows.append({**fields, "txn": key.decode().rsplit(":", 1)[1]})
    return rows


def _check_batches(store: redis.Redis, plan: WarmPlan, options: WarmOptions) -> int:
    """Every batch: one commit, earlier attempts rolled back, in plan order. Returns re-runs."""
    by_batch: dict[int, list[dict[str, str]]] = {}
    for txn in _transactions(store, plan.plan_id):
        by_batch.setdefault(int(txn["batch"]), []).append(txn)
    assert sorted(by_batch) == list(range(BATCHES))
    previous_commit_end = 0.0
    reruns = 0
    for batch in range(BATCHES):
        attempts = sorted(by_batch[batch], key=lambda t: float(t["created"]))
        states = [t["state"] for t in attempts]
        assert states[-1] == "committed" and set(states[:-1]) <= {"rolled_back"}, states
        reruns += len(attempts) - 1
        result = store.hget(f"pw:plan:{plan.plan_id}:done", str(batch))
        assert result and attempts[-1]["txn"].encode() in result
        # Ordered: no attempt of a batch began before the previous batch had committed.
        assert float(attempts[0]["created"]) >= previous_commit_end, (batch, attempts)
        previous_commit_end = float(attempts[-1]["ended"])
    for batch, items in enumerate(plan.batches(options.batch_size)):
        # the committed attempt warmed and verified every item of its batch
        result = json.loads(store.hget(f"pw:plan:{plan.plan_id}:done", str(batch)))
        assert (result["ok"], result["failed"]) == (len(items), 0), result
    return reruns


def _first_start_after(store: redis.Redis, plan_id: str, moment: float) -> float:
    starts = [float(t["created"]) for t in _transactions(store, plan_id)]
    later = [start for start in starts if start > moment]
    assert later, f"plan {plan_id}: nothing ran after the kill"
    return min(later)


def _kill_in_the_middle(workers: Workers, store, sweeper: Sweeper, rng, tag: str, restart: bool):
    settings = sweeper.settings
    items = [prefix_item(i, f"{tag}") for i in range(BATCHES * PER_BATCH)]
    plan = plan_of(items, batch_size=PER_BATCH)
    # one prompt per request: each batch takes a few of the engine's delayed answers
    options = WarmOptions(batch_size=PER_BATCH, ordered=True, prompts_per_request=1)
    plan_id = submit_plan(plan, settings=settings, options=options, queue=workers.queue)
    time.sleep(rng.uniform(0.0, 1.0))
    batch, pool_pid = _claimed_batch(store, plan_id)
    killed_at = time.time()
    workers.kill_whole(workers.owning(pool_pid))
    replacement = workers.start(wait=restart)
    # Without the sweep's resume the plan would wait for the broker's visibility timeout.
    report = wait_plan(plan_id, 90, settings=settings, poll_s=0.05)
    assert report["done"] and report["committed"] == BATCHES, report
    reruns = _check_batches(store, plan, options)
    resumed_by = [began for began, plans in sweeper.sweeps if plan_id in plans]
    assert report["resumed"] >= len(resumed_by) >= (1 if report["resumed"] else 0), report
    if resumed_by:
        # No plan waits longer than the WAL lease plus one sweep: it is resumed by the first
        # sweep that begins once the lease of its dead worker has run out.
        # (On a loaded machine the dead worker may have missed its renewals before the kill, so
        # its lease ran out earlier and a sweep before that bound may have resumed the plan.)
        later = [b for b, _ in sweeper.sweeps if b > killed_at + LEASE_S + EXPIRY_MARGIN_S]
        due = min(later, default=math.inf)
        assert resumed_by[0] <= due, (resumed_by, due, killed_at)
        if not restart:
            waited = _first_start_after(store, plan_id, killed_at) - resumed_by[0]
            assert waited <= PICKUP_SLACK_S, (waited, report)
    replacement.wait_ready(120)
    waited = round(resumed_by[0] - killed_at, 2) if resumed_by else None
    return {"batch": batch, "resumed": report["resumed"], "reruns": reruns, "wait_s": waited}


# Each kill costs a worker start (~20 s of imports on a loaded 2-core machine): the default
# suite runs two rounds, ``-m slow`` the ten the issue asks for.
ROUND_COUNTS = [
    pytest.param(2, id="2-rounds"),
    pytest.param(ROUNDS, id=f"{ROUNDS}-rounds", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("rounds", ROUND_COUNTS)
def test_an_ordered_plan_survives_its_worker_killed_whole_with_a_second_worker(
    workers, store, sweeper, rounds
):
    workers.start()
    workers.start()
    rng = random.Random(16)
    seen = [
        _kill_in_the_middle(workers, store, sweeper, rng, f"second{n}", restart=False)
        for n in range(rounds)
    ]
    # The kills landed inside batches, so the plans were resumed by the sweep, not the broker.
    print("rounds (batch killed, times resumed, re-runs, kill → resume in s):", seen)
    assert sum(1 for r in seen if r["resumed"]) >= rounds // 2, seen


@pytest.mark.parametrize("rounds", ROUND_COUNTS)
def test_an_ordered_plan_survives_its_only_worker_killed_and_restarted(
    workers, store, sweeper, rounds
):
    workers.start()
    rng = random.Random(61)
    seen = [
        _kill_in_the_middle(workers, store, sweeper, rng, f"only{n}", restart=True)
        for n in range(rounds)
    ]
    # Only a kill racing the batch's very end (its next message already sent) needs no resume.
    print("rounds (batch killed, times resumed, re-runs, kill → resume in s):", seen)
    assert sum(1 for r in seen if r["resumed"]) >= rounds - 1, seen
