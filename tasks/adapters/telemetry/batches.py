"""A batch's metrics. On the warm-up's hot path (:func:`defer_batch`) they are summed in the
worker's process and written every ``metrics_flush_s``, so a batch pays neither a round trip nor a
Redis command for them; :func:`record_batch` writes one batch's at once."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from pipeline.errors import PrewarmError
from pipeline.planner.plan import WarmItem
from tasks.adapters.telemetry.read import plan_labels
from tasks.adapters.telemetry.specs import (
    EXIT_WAIT_S,
    SERIES,
    Series,
    history_key,
    series_field,
    warmed_key,
)
from tasks.adapters.telemetry.writer import history_event, item_keys
from tasks.settings import METRICS_FLUSH_S, current_settings


@dataclass(slots=True)
class BatchWrites:
    """Batches' writes: counter increments by series field (a zero one creates the series),
    history events (key -> member -> score) and warmed keys (key -> field -> value)."""

    counters: dict[str, float] = field(default_factory=dict)
    events: dict[str, dict[str, float]] = field(default_factory=dict)
    warmed: dict[str, dict[str, str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.counters or self.events or self.warmed)

    def merge(self, other: BatchWrites) -> None:
        """Add ``other``'s writes to these: counters summed, events and warmed keys kept."""
        for name, value in other.counters.items():
            self.counters[name] = self.counters.get(name, 0.0) + value
        for key, members in other.events.items():
            self.events.setdefault(key, {}).update(members)
        for key, mapping in other.warmed.items():
            self.warmed.setdefault(key, {}).update(mapping)

    def queue(self, pipe: Any) -> None:
        """Queue the writes on ``pipe``."""
        for name, value in self.counters.items():
            pipe.hincrbyfloat(SERIES, name, value)
        for key, members in self.events.items():
            pipe.zadd(key, dict(members))
        for key, mapping in self.warmed.items():
            pipe.hset(key, mapping=cast(Any, mapping))


def _ok_items(items: Sequence[WarmItem], summary: Mapping[str, Any]) -> list[WarmItem]:
    failed = {str(f).split(": ", 1)[0] for f in summary.get("failures", ())}
    return [item for item in items if item.key not in failed]


def _batch_counters(
    labels: tuple[str, str], summary: Mapping[str, Any], ok: Sequence[WarmItem]
) -> dict[str, float]:
    """A batch's counter increments by series field."""
    engine, _ = labels
    state = str(summary.get("state", "unknown"))
    committed = state == "committed"
    warmed, verified = (
        (int(summary.get("items", 0)), int(summary.get("ok", 0))) if committed else (0, 0)
    )
    counters: dict[Series, float] = {
        ("prewarm_batches_total", (*labels, state)): 1,
        ("prewarm_items_warmed_total", labels): warmed,
        ("prewarm_items_verified_total", labels): verified,
        ("prewarm_items_failed_total", labels): int(summary.get("failed", 0)),
        ("prewarm_tokens_primed_total", labels): sum(item.tokens for item in ok),
        ("prewarm_warm_seconds_total", labels): float(summary.get("seconds", 0.0)),
    }
    if summary.get("txn") and state in ("committed", "rolled_back"):
        counters["prewarm_wal_transactions_total", (engine, state)] = 1
    return {series_field(name, values): v for (name, values), v in counters.items()}


def batch_writes(
    labels: tuple[str, str],
    plan_id: str,
    items: Sequence[WarmItem],
    summary: Mapping[str, Any],
    now: float,
) -> BatchWrites:
    """A batch's writes: its counters, its history event and, where it warmed items, one field
    of warmed keys (one per batch, not one per item: this is the hot path)."""
    engine, reason = labels
    state = str(summary.get("state", "unknown"))
    ok = _ok_items(items, summary) if state == "committed" else []
    event = history_event("batch", now, {
        "plan_id": plan_id, "reason": reason, "state": state,
        "items": summary.get("items", 0), "ok": summary.get("ok", 0),
        "failed": summary.get("failed", 0),
    })  # fmt: skip
    writes = BatchWrites(_batch_counters(labels, summary, ok), {history_key(engine): {event: now}})
    if ok:
        batch_field = f"{plan_id}:{summary.get('batch')}"
        writes.warmed[warmed_key(engine)] = {batch_field: json.dumps([now, item_keys(ok)])}
    return writes


class PendingBatches:
    """Batch metrics of this process not written yet: counters summed, events and warmed keys
    kept in order; a daemon thread writes them in one pipeline every ``metrics_flush_s`` of the
    settings (``PREWARM_METRICS_FLUSH_S``; 0: each batch's as it ends), and
    :func:`flush_batch_metrics` (at exit, or where a caller needs them now) writes them at once.

    A batch's result is stored with its commit, so a redelivered batch is never counted twice;
    a worker killed outright loses at most its last ``metrics_flush_s`` of metrics, as a
    Prometheus client's counters die with their process.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writing = threading.Lock()  # one write at a time: a flush waits for one under way
        self.pending = BatchWrites()
        self.store: redis.Redis | None = None
        self.writer_pid: int | None = None

    def add(self, store: redis.Redis, writes: BatchWrites) -> None:
        with self.lock:
            self.pending.merge(writes)
            self.store = store
            first_here = self.writer_pid != os.getpid()  # of this process, or of a fork
            if first_here and flush_interval_s():
                self.writer_pid = os.getpid()
                threading.Thread(target=self._write_every, name="prewarm-metrics",
                                 daemon=True).start()  # fmt: skip

    def _write_every(self) -> None:
        while True:
            try:
                interval = flush_interval_s() or METRICS_FLUSH_S
            except PrewarmError:  # settings changed into bad ones: the commands say so
                interval = METRICS_FLUSH_S
            time.sleep(interval)
            try:
                self.flush()
            except redis.RedisError:
                continue  # kept for the next try

    def flush(self, wait_s: float = -1) -> None:
        """Write what is pending; on a Redis error it stays pending and the error is raised.
        ``wait_s`` >= 0 bounds the wait for a write under way (then nothing is written)."""
        if not self.writing.acquire(timeout=wait_s):
            return
        try:
            self._write()
        finally:
            self.writing.release()

    def _write(self) -> None:
        with self.lock:
            writes, store = self.pending, self.store
            self.pending = BatchWrites()
        if store is None or not writes:
            return
        try:
            _send(store, writes)
        except redis.RedisError:
            with self.lock:  # merged with what came meanwhile, for the next write
                self.pending.merge(writes)
            raise


def _send(store: redis.Redis, writes: BatchWrites) -> None:
    with store.pipeline(transaction=False) as pipe:
        writes.queue(pipe)
        pipe.execute()


PENDING_BATCHES = PendingBatches()


@atexit.register
def _flush_at_exit() -> None:
    with contextlib.suppress(redis.RedisError, OSError):
        flush_batch_metrics(EXIT_WAIT_S)  # a write stuck on a hung Redis must not hang the exit


def defer_batch(
    store: redis.Redis,
    labels: tuple[str, str],
    plan_id: str,
    items: Sequence[WarmItem],
    summary: Mapping[str, Any],
    now: float | None = None,
) -> None:
    """A batch committed or rolled back on the warm-up's hot path (``labels`` from
    :func:`plan_labels`): its metrics are written within :func:`flush_interval_s`, with those
    of the batches after it (see :class:`PendingBatches`)."""
    now = time.time() if now is None else now
    PENDING_BATCHES.add(store, batch_writes(labels, plan_id, items, summary, now))
    if not flush_interval_s():
        PENDING_BATCHES.flush()


def flush_interval_s() -> float:
    """Seconds a batch's metrics wait before they are written (``metrics_flush_s``)."""
    return current_settings().metrics_flush_s


def flush_batch_metrics(wait_s: float = -1) -> None:
    """Write this process's pending batch metrics now (``wait_s``: see
    :meth:`PendingBatches.flush`)."""
    PENDING_BATCHES.flush(wait_s)


def record_batch(
    store: redis.Redis,
    engine: str,
    plan_id: str,
    items: Sequence[WarmItem],
    summary: dict[str, Any],
    now: float | None = None,
) -> dict[str, Any]:
    """A batch ended (``summary`` as ``BatchRunner.run`` returns it), written at once, not
    through the worker's pending metrics (:func:`defer_batch`); returns ``summary``.

    A duplicate delivery (a stored result) is not counted again.
    """
    if summary.get("duplicate"):
        return summary
    labels = plan_labels(store, plan_id, engine)
    now = time.time() if now is None else now
    _send(store, batch_writes(labels, plan_id, items, summary, now))
    return summary
