"""The WAL state machine: legal steps, rollback order, orphans."""

from __future__ import annotations

import pytest

from pipeline.errors import ConsistencyError
from pipeline.wal import (
    Effect,
    Transaction,
    TxnState,
    can_move,
    irreversible,
    is_orphaned,
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
