"""A worker process SIGKILLed mid-batch, 20 times at random points: after the recovery sweep the
cache holds either the state before the transaction or the committed state — never a mix."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import httpx
import pytest

from pipeline.keys import decode_value
from pipeline.wal import FINAL_STATES
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.targets.base import WarmOptions
from tasks.adapters.wal_store import WalStore
from tasks.warm_tasks import recover, submit_plan, wait_plan
from tests.integration.warm.conftest import adapter_item, plan_of, response_item

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


def _state(store, sim, keys, adapter):
    values = {k: store.get(k) for k in keys}
    ttls = {k: store.pttl(k) for k in keys}
    return values, ttls, adapter in _loaded(sim)


def _is_before(snapshot, before) -> bool:
    values, ttls, loaded = snapshot
    same = all(values[k] == (v.encode() if v else None) for k, (v, _) in before.items())
    ttl_ok = all(ttls[k] > 0 for k, (_, ttl) in before.items() if ttl)
    return same and ttl_ok and not loaded


def _is_committed(snapshot) -> bool:
    values, _, loaded = snapshot
    written = all(v is not None and decode_value(v).get("item") == k for k, v in values.items())
    return written and loaded


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
    items = [response_item(i, f"kill{n}") for i in range(4)] + [adapter_item(f"lora-{n + 1}")]
    keys = [item.key for item in items[:4]]
    before = {keys[0]: (f'{{"text": "before-{n}-a"}}', 300), keys[1]: (f'{{"text": "b{n}"}}', None),
              keys[2]: (None, None), keys[3]: (None, None)}  # fmt: skip
    store.set(keys[0], before[keys[0]][0], ex=300)
    store.set(keys[1], before[keys[1]][0])
    options = WarmOptions(apply_chunk=1)
    plan_id = submit_plan(plan_of(items), settings=settings, options=options, queue=queue)
    plans, wal = PlanStore(store), WalStore(store, settings.wal_lease_s)
    txn = _wait_for_txn(plans, plan_id)
    pid = int((store.hget(f"pw:wal:txn:{txn}", "owner") or b"0").split(b"-")[0])
    time.sleep(rng.uniform(0.0, 0.45))
    os.kill(pid, signal.SIGKILL)
    _wait_expired(wal, txn)
    recover(settings=settings)
    _wait_final(wal, txn)  # the sweep, or a redelivery that found the lease expired first
    snapshot = _state(store, sim, keys, items[4].adapter)
    assert wal.state(txn) in FINAL_STATES
    if plans.txn(plan_id, 0) != txn:  # a redelivery already began again: judge it when done
        wait_plan(plan_id, 60, settings=settings)
        snapshot = _state(store, sim, keys, items[4].adapter)
    assert _is_before(snapshot, before) != _is_committed(snapshot), (n, snapshot)
    return "before" if _is_before(snapshot, before) else "committed"


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
