"""The WAL state machine: legal steps, rollback order, orphans."""

from __future__ import annotations

import pytest

from pipeline.errors import ConsistencyError
from pipeline.wal import (
    Effect,
    PlanProgress,
    Transaction,
    TxnState,
    batches_to_resume,
    can_move,
    irreversible,
    is_orphaned,
    is_stalled,
    redis_before_image,
    rollback_order,
)


def test_happy_path_and_illegal_steps():
    txn = Transaction("t1", "p", 0, "e")
    txn = txn.moved(TxnState.APPLYING).moved(TxnState.VERIFYING).moved(TxnState.COMMITTED)
    assert txn.is_final
    with pytest.raises(ConsistencyError):
        txn.moved(TxnState.ROLLED_BACK)
    assert not can_move(TxnState.BEGIN, TxnState.COMMITTED)
    assert can_move(TxnState.APPLYING, TxnState.ROLLED_BACK)
    assert can_move(TxnState.ROLLED_BACK, TxnState.ROLLED_BACK)  # repeating a rollback is a no-op


def test_rollback_is_reverse_and_keeps_the_first_before_image_per_key():
    effects = [
        Effect(0, "redis", "set", "a", True, {"value": None, "ttl_ms": -1}),
        Effect(1, "engine", "prime", "p", False),
        Effect(2, "redis", "set", "b", True, {"value": "old", "ttl_ms": 500}),
        Effect(3, "redis", "set", "a", True, {"value": "mid", "ttl_ms": -1}),
        Effect(4, "engine", "load_adapter", "lora", True, None, {"op": "unload_adapter"}),
    ]
    order = rollback_order(effects)
    assert [e.seq for e in order] == [4, 2, 0]
    assert order[-1].before == {"value": None, "ttl_ms": -1}
    assert [e.seq for e in irreversible(effects)] == [1]


def test_effect_json_round_trip():
    effect = Effect(7, "redis", "set", "k", True, {"value": "v", "ttl_ms": 10}, None, "item")
    assert Effect.from_json(effect.to_json()) == effect


def test_orphans_are_open_transactions_with_expired_leases():
    open_txn = Transaction("t", "p", 0, "e", TxnState.APPLYING, lease_until=100.0)
    assert is_orphaned(open_txn, now=101.0)
    assert not is_orphaned(open_txn, now=99.0)
    assert not is_orphaned(open_txn.moved(TxnState.ROLLED_BACK), now=101.0)


def test_before_image_of_an_absent_key_has_no_ttl():
    assert redis_before_image(None, -2) == {"value": None, "ttl_ms": -1}
    assert redis_before_image(b"x", 1500) == {"value": "x", "ttl_ms": 1500}


# --- plans after a worker died --------------------------------------------------------------


def _progress(done=(), claimed=(), live=0, last_active=100.0, batches=4):
    return PlanProgress("p", batches, frozenset(done), frozenset(claimed), live, last_active)


def test_a_plan_silent_for_one_lease_with_nothing_running_is_stalled():
    progress = _progress(done={0, 1})
    assert not is_stalled(progress, now=129.0, stall_s=30)
    assert is_stalled(progress, now=131.0, stall_s=30)
    assert batches_to_resume(progress) == [2, 3]


@pytest.mark.parametrize(
    "progress",
    [
        _progress(done={0, 1, 2, 3}),  # finished
        _progress(done={0}, claimed={1}),  # a worker holds its next batch
        _progress(done={0}, live=1),  # a transaction's lease is still running
    ],
)
def test_a_running_or_finished_plan_is_never_stalled(progress):
    assert not is_stalled(progress, now=10_000.0, stall_s=30)


def test_resume_keeps_plan_order_and_skips_finished_batches():
    assert batches_to_resume(_progress(done={0, 2}, batches=5)) == [1, 3, 4]
