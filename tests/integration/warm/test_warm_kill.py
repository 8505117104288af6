"""A worker process SIGKILLed mid-batch, 20 times at random points: after the recovery sweep the
engine holds either the state before the transaction or the committed state — never a mix: the
batch's adapter (its reversible effect) is loaded exactly when its transaction committed, and
unloaded again when it rolled back."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import httpx
import pytest

from pipeline.wal import FINAL_STATES
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.targets.base import WarmOptions
from tasks.adapters.wal_store import WalStore
from tasks.warm_tasks import recover, submit_plan, wait_plan
from tests.integration.warm.conftest import adapter_item, plan_of, prefix_item

pytestmark = pytest.mark.integration
ROUNDS = 20


def _loaded(sim) -> set[str]:
    return {card["id"] for card in httpx.get(sim.url + "/v1/models").json()["data"]}


def _wait_for_txn(plans: PlanStore, plan_id: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        txn = plans.txn(plan_id, 0)
        if txn:
            return txn
        time.sleep(0.002)
    raise AssertionError(f"plan {plan_id} never began a transaction")


def _state(sim, wal: WalStore, txn: str, adapter: str) -> tuple[str, bool]:
    """The transaction's final state and whether the engine has its adapter loaded."""
    return str(wal.state(txn)), adapter in _loaded(sim)


def _wait_expired(wal: WalStore, txn: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and txn not in wal.expired():
        if wal.state(txn) in FINAL_STATES:
            return
        time.sleep(0.02)


def _wait_final(wal: WalStore, txn: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and wal.state(txn) not in FINAL_STATES:
        time.sleep(0.02)


def _one_round(n, sim, store, settings, queue, rng) -> str:
    adapter = f"lora-{n + 1}"  # never loaded before this round
    items = [prefix_item(i, f"kill{n}") for i in range(2)] + [adapter_item(adapter)]
    items += [prefix_item(i, f"kill{n}-after") for i in range(2)]
    assert adapter not in _loaded(sim)
    # one step and one prompt per request: room for kill points before, at and after the load
    options = WarmOptions(apply_chunk=1, prompts_per_request=1)
    plan_id = submit_plan(plan_of(items), settings=settings, options=options, queue=queue)
    plans, wal = PlanStore(store), WalStore(store, settings.wal_lease_s)
    txn = _wait_for_txn(plans, plan_id)
    pid = int((store.hget(f"pw:wal:txn:{txn}", "owner") or b"0").split(b"-")[0])
    time.sleep(rng.uniform(0.0, 0.45))
    os.kill(pid, signal.SIGKILL)
    _wait_expired(wal, txn)
    recover(settings=settings)
    _wait_final(wal, txn)  # the sweep, or a redelivery that found the lease expired first
    assert wal.state(txn) in FINAL_STATES
    if plans.txn(plan_id, 0) != txn:  # a redelivery already began again: judge it when done
        wait_plan(plan_id, 60, settings=settings)
        txn = plans.txn(plan_id, 0)
    state, loaded = _state(sim, wal, txn, adapter)
    assert (state, loaded) in (("committed", True), ("rolled_back", False)), (n, state, loaded)
    return "before" if state == "rolled_back" else "committed"


def test_sigkill_mid_batch_leaves_before_or_committed_state(
    sim, warm_worker, warm_settings, warm_queue, store, tmp_path: Path
):
    rng = random.Random(5)
    sim.engine.config.faults.delay_s = 0.02  # ~0.2 s per batch: room for random kill points
    try:
        outcomes = [
            _one_round(n, sim, store, warm_settings, warm_queue, rng) for n in range(ROUNDS)
        ]
    finally:
        sim.engine.config.faults.delay_s = 0.0
    assert outcomes.count("before") >= 1, outcomes
    assert warm_worker.proc.poll() is None  # the pool replaced its killed processes
