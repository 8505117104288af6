"""The Redis WAL and the shared engine semaphore, on a real Redis (no worker needed)."""

from __future__ import annotations

import pytest

from pipeline.errors import ConsistencyError, TransientError
from pipeline.wal import TxnState
from tasks.adapters.engine_semaphore import EngineSemaphore
from tasks.adapters.wal_store import LeaseLost, RedisWrite, WalStore

pytestmark = pytest.mark.integration


def test_rollback_restores_before_images_with_ttl_and_is_idempotent(store):
    store.set("k:ttl", "old", px=60_000)
    store.set("k:plain", "older")
    wal = WalStore(store, lease_s=30)
    txn = wal.begin("p", 0, "e", owner="w1")
    wal.move(txn.txn_id, "w1", TxnState.APPLYING)
    writes = [
        RedisWrite("k:ttl", "new", 100),
        RedisWrite("k:plain", "new"),
        RedisWrite("k:absent", "new", 5),
    ]
    wal.apply_redis(txn.txn_id, "w1", writes)
    wal.apply_redis(txn.txn_id, "w1", [RedisWrite("k:ttl", "newer", 100)])  # same key twice
    assert store.get("k:ttl") == b"newer" and store.get("k:absent") == b"new"
    undone = []
    wal.rollback(txn.txn_id, "w1", undone.append)
    wal.rollback(txn.txn_id, "w1", undone.append)  # again: nothing changes, no error
    assert store.get("k:ttl") == b"old" and 0 < store.pttl("k:ttl") <= 60_000
    assert store.get("k:plain") == b"older" and store.ttl("k:plain") == -1
    assert store.get("k:absent") is None
    assert wal.state(txn.txn_id) == TxnState.ROLLED_BACK and undone == []
    with pytest.raises(ConsistencyError):
        wal.finish(txn.txn_id, "w1", TxnState.COMMITTED)


def test_a_taken_over_worker_can_write_nothing_more(store, clock):
    wal = WalStore(store, lease_s=1, clock=clock)
    txn = wal.begin("p", 0, "e", owner="slow-worker")
    wal.move(txn.txn_id, "slow-worker", TxnState.APPLYING)
    assert not wal.take_over(txn.txn_id, "sweeper")  # lease still live
    clock.advance(1.1)
    assert wal.take_over(txn.txn_id, "sweeper")
    assert not wal.renew(txn.txn_id, "slow-worker")
    with pytest.raises(LeaseLost):
        wal.apply_redis(txn.txn_id, "slow-worker", [RedisWrite("zombie", "x")])
    with pytest.raises(LeaseLost):
        wal.move(txn.txn_id, "slow-worker", TxnState.VERIFYING)
    assert store.get("zombie") is None
    wal.rollback(txn.txn_id, "sweeper")
    assert wal.summary()["open"] == 0


def test_sweep_undoes_engine_effects_newest_first(store, clock):
    from pipeline.wal import Effect

    wal = WalStore(store, lease_s=1, clock=clock)
    txn = wal.begin("p", 0, "e", owner="dead")
    wal.move(txn.txn_id, "dead", TxnState.APPLYING)
    wal.record(txn.txn_id, "dead", [Effect(0, "engine", "prime", "pfx", False)])
    for n, name in enumerate(("a", "b")):
        undo = {"op": "unload_adapter", "name": name}
        wal.record(
            txn.txn_id, "dead", [Effect(n + 1, "engine", "load_adapter", name, True, None, undo)]
        )
    clock.advance(1.1)
    undone: list[str] = []
    assert wal.sweep(lambda engine: lambda effect: undone.append(effect.undo["name"])) == [
        txn.txn_id
    ]
    assert undone == ["b", "a"] and wal.sweep() == []


def test_engine_semaphore_is_shared_and_holders_expire(store, clock):
    first = EngineSemaphore(store, "e", limit=2, hold_s=0.5, clock=clock)
    other_process = EngineSemaphore(store, "e", limit=2, hold_s=0.5, clock=clock)
    assert first.try_acquire("a") and other_process.try_acquire("b")
    assert not first.try_acquire("c")
    with pytest.raises(TransientError), other_process.slot(wait_s=0.1, holder="c"):
        pass
    clock.advance(0.6)  # a and b died without releasing: their slots expire
    with first.slot(wait_s=1.0, holder="c"):
        assert first.holders() == 1
    assert first.holders() == 0


def test_sweep_rolls_back_a_batch_of_an_engine_no_longer_configured(store, clock):
    from tasks.services.batch_runner import BatchRunner
    from tasks.settings import Settings

    settings = Settings.model_validate({"wal_lease_s": 1})  # no engines at all
    wal = WalStore(store, lease_s=1, clock=clock)
    txn = wal.begin("p", 0, "retired-engine", owner="dead")
    wal.move(txn.txn_id, "dead", TxnState.APPLYING)
    wal.apply_redis(txn.txn_id, "dead", [RedisWrite("entry", "half-written")])
    clock.advance(1.1)
    assert BatchRunner(store, settings).sweep(now=clock()) == [txn.txn_id]
    assert store.get("entry") is None
