"""The write-ahead log state machine (pure): transactions, effect records, rollback order.

One warm-up batch is one transaction::

    begin -> applying -> verifying -> committed
      \\________\\___________\\-------> rolled_back

Every side effect is described by an :class:`Effect` *before* it happens, carrying the
before-image of what it touches (for a Redis key: the old value and TTL, or absent). Effects
that cannot be undone — priming an engine's prefix cache — are recorded as irreversible, so an
operator can see they happened. Rollback walks reversible effects in reverse order; every undo
step restores a before-image or repeats an idempotent engine call, so running it twice is
harmless. The Redis store in ``tasks/adapters/wal_store.py`` persists these records; this
module decides what is legal.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from pipeline.errors import ConsistencyError


class TxnState(StrEnum):
    """Where a transaction stands."""

    BEGIN = "begin"
    APPLYING = "applying"
    VERIFYING = "verifying"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"


FINAL_STATES = frozenset({TxnState.COMMITTED, TxnState.ROLLED_BACK})

_NEXT: dict[TxnState, frozenset[TxnState]] = {
    TxnState.BEGIN: frozenset({TxnState.APPLYING, TxnState.ROLLED_BACK}),
    TxnState.APPLYING: frozenset({TxnState.VERIFYING, TxnState.ROLLED_BACK}),
    TxnState.VERIFYING: frozenset({TxnState.COMMITTED, TxnState.ROLLED_BACK}),
    TxnState.COMMITTED: frozenset(),
    TxnState.ROLLED_BACK: frozenset(),
}


def sources(target: TxnState) -> list[TxnState]:
    """States from which ``target`` may be entered (itself included: repeating is a no-op)."""
    return [target, *(state for state, nexts in _NEXT.items() if target in nexts)]


def can_move(current: TxnState, target: TxnState) -> bool:
    """Whether ``current -> target`` is a legal step (staying in place is legal and a no-op)."""
    return current == target or target in _NEXT[current]


def check_move(txn_id: str, current: TxnState, target: TxnState) -> None:
    """Raise :class:`ConsistencyError` for an illegal step (e.g. rolling back a commit)."""
    if not can_move(current, target):
        raise ConsistencyError(f"transaction {txn_id}: illegal step {current} -> {target}")


@dataclass(frozen=True, slots=True)
class Effect:
    """One side effect, recorded before it happens.

    ``target`` says what it touches (``redis`` for a cache key, ``engine`` for an engine call).
    ``before`` is the before-image: for a Redis key ``{"value": str | None, "ttl_ms": int}``
    (``value`` None = the key was absent). ``undo`` describes the compensating engine call for
    reversible engine effects (e.g. unloading an adapter that was not loaded before).
    """

    seq: int
    target: str
    op: str
    key: str
    reversible: bool
    before: Mapping[str, Any] | None = None
    undo: Mapping[str, Any] | None = None
    item_key: str = ""

    def to_json(self) -> str:
        """JSON text of this record (what the store appends to the log)."""
        # Field by field, not dataclasses.asdict: its deep copies were most of a batch's WAL cost.
        fields = {name: getattr(self, name) for name in _EFFECT_FIELDS}
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Effect:
        """Parse a record written by :meth:`to_json`."""
        data = json.loads(raw)
        return cls(**data)


_EFFECT_FIELDS = tuple(Effect.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class Transaction:
    """A batch's transaction: identity, state, lease deadline and its effect records."""

    txn_id: str
    plan_id: str
    batch: int
    engine: str
    state: TxnState = TxnState.BEGIN
    lease_until: float = 0.0
    effects: tuple[Effect, ...] = field(default=())

    def moved(self, target: TxnState) -> Transaction:
        """This transaction in state ``target``; illegal steps raise."""
        check_move(self.txn_id, self.state, target)
        return replace(self, state=target)

    @property
    def is_final(self) -> bool:
        """Committed or rolled back: nothing left to do."""
        return self.state in FINAL_STATES


def is_orphaned(txn: Transaction, now: float) -> bool:
    """An open transaction whose worker stopped renewing its lease: the sweep rolls it back."""
    return not txn.is_final and txn.lease_until < now


def rollback_order(effects: Iterable[Effect]) -> list[Effect]:
    """Reversible effects, newest first: the order in which their undo steps run.

    Only the first record per key counts (its before-image is the state before the
    transaction); later records on the same key are skipped, which is what makes the restored
    state equal the state before the transaction, not an intermediate one.
    """
    first_per_key: dict[tuple[str, str], Effect] = {}
    for effect in sorted(effects, key=lambda e: e.seq):
        if effect.reversible:
            first_per_key.setdefault((effect.target, effect.key), effect)
    return sorted(first_per_key.values(), key=lambda e: e.seq, reverse=True)


def irreversible(effects: Iterable[Effect]) -> list[Effect]:
    """Effects that happened and cannot be undone (reported by ``prewarm wal status``)."""
    return [e for e in effects if not e.reversible]


def redis_before_image(value: str | bytes | None, ttl_ms: int) -> dict[str, Any]:
    """Before-image of a Redis key from ``GET`` and ``PTTL`` (-1 no expiry, -2 absent)."""
    if isinstance(value, bytes):
        value = value.decode()
    return {"value": value, "ttl_ms": ttl_ms if value is not None and ttl_ms > 0 else -1}


# --- plans after a worker died --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanProgress:
    """Where a submitted plan stands, as the recovery sweep sees it.

    ``last_active`` is the last sign of life of any of its batches (submitted, claimed, a lease
    renewal, a result), renewed every third of the WAL lease while a batch runs.
    """

    plan_id: str
    batches: int
    done: frozenset[int]
    claimed: frozenset[int]
    live_txns: int
    last_active: float


def is_stalled(progress: PlanProgress, now: float, stall_s: float) -> bool:
    """A plan with batches left, none running, and no sign of life for ``stall_s`` seconds.

    Its next message was lost with a worker (or its transaction was rolled back by the sweep):
    nothing will run it again until the broker's visibility timeout, so the sweep re-queues it.
    """
    if len(progress.done) >= progress.batches:
        return False
    if progress.claimed or progress.live_txns:
        return False
    return now - progress.last_active > stall_s


def batches_to_resume(progress: PlanProgress) -> list[int]:
    """Batches still to run, in plan order (an ordered plan resumes as a chain of these)."""
    return [n for n in range(progress.batches) if n not in progress.done]
