"""prewarm's own metrics, kept in the store Redis so one scrape of the api sees the whole cluster.

Whichever worker planned, warmed, rolled back or fired a trigger, it adds to the same series in
the store; ``jobs.api`` reads them at scrape time. Labels are bounded: engine (configured
names), reason (``window``, ``replica``, ``template``, ``trigger``, ``cli``, ``demo``), outcome,
trigger kind, miss cause — never item keys.

Layout (under ``pw:metrics:``)::

    series             hash   JSON [name, labels] -> value (counters add, gauges set)
    plan:<plan_id>     string "engine<TAB>reason" of a submitted plan (8 days)
    warmed:<engine>    hash   "plan:batch" of a committed batch -> JSON [when, item keys]
    planned:<engine>   hash   item key -> when a plan last named it
    engine:<engine>    hash   last engine sample (JSON), last plan's dropped count
    history:<engine>   zset   events by time (samples, plans, batches, restarts, windows),
                              kept for ``HISTORY_S``; what ``prewarm report`` reads

The ``record_*`` functions are the call sites' one line each; each is one round trip or two.
A batch's metrics are summed in the worker's process and written every ``metrics_flush_s``
(:func:`defer_batch`): the warm-up's hot path pays neither a round trip nor a Redis command
for them.
A third of this module is :data:`SPECS`, the table of metric families the api exposes.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

import redis

from pipeline.errors import PrewarmError
from pipeline.planner.plan import WarmItem, WarmPlan
from pipeline.triggers import (
    EngineSample,
    bucket_delta,
    histogram_quantile,
    interval_hit_rate,
)
from pipeline.window_outcome import WarmState, WindowOutcome, window_outcome
from tasks.adapters import redis_keys
from tasks.settings import METRICS_FLUSH_S, current_settings

PREFIX = redis_keys.METRICS
SERIES = PREFIX + "series"
#: History kept for the report: a week and a day.
HISTORY_S = 8 * 86400
#: Seconds an exiting process waits for a metrics write under way before it gives up.
EXIT_WAIT_S = 5.0
#: Committed batches and distinct planned items remembered per engine (oldest dropped first).
MAX_ITEMS = 50_000


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family: its type, help text and label names."""

    kind: str  # "counter" | "gauge"
    help: str
    labels: tuple[str, ...]


ER = ("engine", "reason")
SPECS: dict[str, MetricSpec] = {
    "prewarm_plans_total": MetricSpec("counter", "Warm-up plans submitted", ER),
    "prewarm_items_planned_total": MetricSpec("counter", "Items in submitted plans", ER),
    "prewarm_tokens_planned_total": MetricSpec("counter", "Prompt tokens in submitted plans", ER),
    "prewarm_items_dropped_total": MetricSpec("counter", "Candidates plans left out (budget)", ER),
    "prewarm_items_warmed_total": MetricSpec("counter", "Items applied by committed batches", ER),
    "prewarm_items_verified_total": MetricSpec("counter", "Items that passed verification", ER),
    "prewarm_items_failed_total": MetricSpec("counter", "Items that failed to warm or verify", ER),
    "prewarm_tokens_primed_total": MetricSpec(
        "counter", "Prompt tokens of items warmed and verified", ER
    ),
    "prewarm_batches_total": MetricSpec(
        "counter", "Warm-up batches by outcome", ("engine", "reason", "outcome")
    ),
    "prewarm_warm_seconds_total": MetricSpec("counter", "Seconds spent running batches", ER),
    "prewarm_wal_transactions_total": MetricSpec(
        "counter",
        "WAL transactions ended, by outcome (committed, rolled_back, recovered)",
        ("engine", "outcome"),
    ),
    "prewarm_trigger_firings_total": MetricSpec(
        "counter", "Triggers that fired a warm-up", ("engine", "kind")
    ),
    "prewarm_trigger_cooldown_skips_total": MetricSpec(
        "counter", "Triggers skipped while their cooldown ran", ("engine", "kind")
    ),
    "prewarm_loop_ticks_total": MetricSpec(
        "counter", "Warm-up loop ticks by outcome (ok, failed)", ("engine", "outcome")
    ),
    "prewarm_loop_interval_seconds": MetricSpec(
        "gauge", "The loop's period (schedule.window_s)", ("engine",)
    ),
    "prewarm_loop_last_tick_timestamp_seconds": MetricSpec(
        "gauge", "When the loop last ticked", ("engine",)
    ),
    "prewarm_loop_last_success_timestamp_seconds": MetricSpec(
        "gauge", "When the loop last ticked successfully", ("engine",)
    ),
    "prewarm_window_requests_total": MetricSpec(
        "counter", "Requests of closed windows", ("engine",)
    ),
    "prewarm_window_covered_requests_total": MetricSpec(
        "counter", "Requests of closed windows whose item was warm", ("engine",)
    ),
    "prewarm_window_misses_total": MetricSpec(
        "counter", "Requests whose item was not warm, by cause", ("engine", "cause")
    ),
    "prewarm_warm_coverage_ratio": MetricSpec(
        "gauge", "Share of the last closed window's requests whose item was warm", ("engine",)
    ),
    "prewarm_window_misses_requests": MetricSpec(
        "gauge", "Requests of the last closed window not warm, by cause", ("engine", "cause")
    ),
    "prewarm_forecast_absolute_error_requests": MetricSpec(
        "gauge",
        "Sum of |predicted - observed| requests over items, last closed window",
        ("engine",),
    ),
    "prewarm_forecast_relative_error_ratio": MetricSpec(
        "gauge", "Forecast absolute error over observed requests, last closed window", ("engine",)
    ),
    "prewarm_engine_up": MetricSpec(
        "gauge", "Whether the engine answered its /metrics at the last watch", ("engine",)
    ),
    "prewarm_engine_prefix_cache_hits_total": MetricSpec(
        "counter", "The engine's own vllm:prefix_cache_hits (tokens), as last read", ("engine",)
    ),
    "prewarm_engine_prefix_cache_queries_total": MetricSpec(
        "counter", "The engine's own vllm:prefix_cache_queries (tokens), as last read", ("engine",)
    ),
    "prewarm_engine_prefix_cache_hit_ratio": MetricSpec(
        "gauge", "The engine's prefix-cache hit rate between the last two reads", ("engine",)
    ),
    "prewarm_engine_ttft_p50_seconds": MetricSpec(
        "gauge", "The engine's median time to first token between the last two reads", ("engine",)
    ),
    "prewarm_engine_start_time_seconds": MetricSpec(
        "gauge", "The engine process's start time (a change is a restart)", ("engine",)
    ),
    "prewarm_engine_restarts_total": MetricSpec(
        "counter", "Engine restarts seen by the watcher", ("engine",)
    ),
}


def series_field(name: str, labels: Sequence[str]) -> str:
    """The field of one series in the ``series`` hash."""
    return _field(name, tuple(labels))


@functools.lru_cache(maxsize=4096)  # labels are bounded (see the module docstring)
def _field(name: str, labels: tuple[str, ...]) -> str:
    return json.dumps([name, list(labels)], separators=(",", ":"))


#: a gauge's name and label values
Series = tuple[str, tuple[str, ...]]


class _SeriesWriter:
    """Writes to the ``series`` hash, queued on one pipeline (or sent on a client)."""

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe

    def add(self, name: str, labels: Sequence[str], value: float) -> None:
        """Add ``value`` to a counter."""
        self.pipe.hincrbyfloat(SERIES, series_field(name, labels), value)

    def set(self, gauges: Mapping[Series, float | None]) -> None:
        """Set gauges (one command for all of them); None leaves a gauge as it was."""
        mapping = {series_field(n, labels): v for (n, labels), v in gauges.items() if v is not None}
        if mapping:
            self.pipe.hset(SERIES, mapping=mapping)


def _plan_key(plan_id: str) -> str:
    return f"{PREFIX}plan:{plan_id}"


def _history_key(engine: str) -> str:
    return f"{PREFIX}history:{engine}"


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _event(kind: str, ts: float, data: Mapping[str, Any]) -> str:
    """A history event as stored (a unique member of the history's sorted set)."""
    return json.dumps({"kind": kind, "ts": ts, **data, "id": os.urandom(4).hex()})


def _history(
    pipe: Any, engine: str, kind: str, ts: float, data: Mapping[str, Any], trim: bool = False
) -> None:
    """Add an event; ``trim`` (on the infrequent events) drops those older than the history."""
    pipe.zadd(_history_key(engine), {_event(kind, ts, data): ts})
    if trim:
        pipe.zremrangebyscore(_history_key(engine), "-inf", ts - HISTORY_S)


# -- call sites ----------------------------------------------------------------------------
def record_plan(
    store: redis.Redis,
    plan: WarmPlan,
    engine: str,
    reason: str | None = None,
    now: float | None = None,
) -> None:
    """A plan was submitted for ``engine``: count it, its items and tokens; remember its keys."""
    now = time.time() if now is None else now
    reason = reason or plan.reason.value
    labels = (engine, reason)
    with store.pipeline(transaction=False) as pipe:
        pipe.set(_plan_key(plan.plan_id), f"{engine}\t{reason}", ex=HISTORY_S)
        series = _SeriesWriter(pipe)
        series.add("prewarm_plans_total", labels, 1)
        series.add("prewarm_items_planned_total", labels, len(plan.items))
        series.add("prewarm_tokens_planned_total", labels, plan.tokens)
        series.add("prewarm_items_dropped_total", labels, plan.dropped)
        if plan.items:
            pipe.hset(
                f"{PREFIX}planned:{engine}", mapping=dict.fromkeys(_keys(plan.items), int(now))
            )
        pipe.hset(f"{PREFIX}engine:{engine}", "last_dropped", plan.dropped)
        _history(pipe, engine, "plan", now, {
            "plan_id": plan.plan_id, "reason": reason, "items": len(plan.items),
            "tokens": plan.tokens, "dropped": plan.dropped,
        })  # fmt: skip
        pipe.execute()


#: Labels of the plans this process ran batches of (a plan's labels never change), so a batch
#: costs no round trip of its own for them. Bounded: the oldest entries go first.
_PLAN_LABELS: dict[str, tuple[str, str]] = {}
_PLAN_LABELS_MAX = 1024


def _keys(items: Iterable[WarmItem]) -> list[str]:
    return [item.key for item in items]


def plan_labels(store: redis.Redis, plan_id: str, engine: str) -> tuple[str, str]:
    """(engine, reason) of a submitted plan, as :func:`record_plan` stored them; read once per
    plan and process."""
    known = _PLAN_LABELS.get(plan_id)
    if known is not None:
        return known
    raw = store.get(_plan_key(plan_id))
    if not raw:
        return engine, "cli"  # a plan stored without submit (a re-warm's own batch)
    stored_engine, _, reason = _text(raw).partition("\t")
    labels = (stored_engine or engine, reason or "cli")
    if len(_PLAN_LABELS) >= _PLAN_LABELS_MAX:
        del _PLAN_LABELS[next(iter(_PLAN_LABELS))]
    _PLAN_LABELS[plan_id] = labels
    return labels


def _ok_items(items: Sequence[WarmItem], summary: Mapping[str, Any]) -> list[WarmItem]:
    failed = {str(f).split(": ", 1)[0] for f in summary.get("failures", ())}
    return [item for item in items if item.key not in failed]


#: A batch's writes: counters, its history event (key, score, member), its warmed keys or None.
_BatchWrites = tuple[dict[str, float], tuple[str, float, str], tuple[str, str, str] | None]


def _batch_metrics(
    labels: tuple[str, str],
    plan_id: str,
    items: Sequence[WarmItem],
    summary: Mapping[str, Any],
    now: float,
) -> _BatchWrites:
    """A batch's writes: counters (series field -> increment), its history event (key, score,
    member) and its warmed keys (hash key, field, value; None when nothing was warmed)."""
    engine, reason = labels
    state = str(summary.get("state", "unknown"))
    committed = state == "committed"
    ok = _ok_items(items, summary) if committed else []
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
    event = _event("batch", now, {
        "plan_id": plan_id, "reason": reason, "state": state,
        "items": summary.get("items", 0), "ok": summary.get("ok", 0),
        "failed": summary.get("failed", 0),
    })  # fmt: skip
    kept = None
    if ok:  # one field per batch (not one per item: this is the hot path)
        kept = (f"{PREFIX}warmed:{engine}", f"{plan_id}:{summary.get('batch')}",
                json.dumps([now, _keys(ok)]))  # fmt: skip
    fields = {series_field(name, values): v for (name, values), v in counters.items()}
    return fields, (_history_key(engine), now, event), kept


def _queue_writes(
    pipe: Any,
    counters: Mapping[str, float],
    events: Mapping[str, Mapping[str, float]],
    warmed: Mapping[str, Mapping[str, str]],
) -> None:
    """Queue batches' writes on ``pipe``: counter increments (a zero one creates the series),
    history events (key -> member -> score) and warmed keys (key -> field -> value)."""
    for name, value in counters.items():
        pipe.hincrbyfloat(SERIES, name, value)
    for key, members in events.items():
        pipe.zadd(key, dict(members))
    for key, mapping in warmed.items():
        pipe.hset(key, mapping=cast(Any, mapping))


class _PendingBatches:
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
        self.counters: dict[str, float] = {}
        self.events: dict[str, dict[str, float]] = {}
        self.warmed: dict[str, dict[str, str]] = {}
        self.store: redis.Redis | None = None
        self.writer_pid: int | None = None

    def add(self, store: redis.Redis, metrics: _BatchWrites) -> None:
        fields, (history, score, member), kept = metrics
        with self.lock:
            for name, value in fields.items():
                self.counters[name] = self.counters.get(name, 0.0) + value
            self.events.setdefault(history, {})[member] = score
            if kept is not None:
                self.warmed.setdefault(kept[0], {})[kept[1]] = kept[2]
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
            counters, events, warmed, store = self.counters, self.events, self.warmed, self.store
            self.counters, self.events, self.warmed = {}, {}, {}
        if store is None or not (counters or events or warmed):
            return
        try:
            with store.pipeline(transaction=False) as pipe:
                _queue_writes(pipe, counters, events, warmed)
                pipe.execute()
        except redis.RedisError:
            with self.lock:  # merged with what came meanwhile, for the next write
                for name, value in counters.items():
                    self.counters[name] = self.counters.get(name, 0.0) + value
                for key, members in events.items():
                    self.events.setdefault(key, {}).update(members)
                for key, mapping in warmed.items():
                    self.warmed.setdefault(key, {}).update(mapping)
            raise


_PENDING = _PendingBatches()


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
    of the batches after it (see :class:`_PendingBatches`)."""
    now = time.time() if now is None else now
    _PENDING.add(store, _batch_metrics(labels, plan_id, items, summary, now))
    if not flush_interval_s():
        _PENDING.flush()


def flush_interval_s() -> float:
    """Seconds a batch's metrics wait before they are written (``metrics_flush_s``)."""
    return current_settings().metrics_flush_s


def flush_batch_metrics(wait_s: float = -1) -> None:
    """Write this process's pending batch metrics now (``wait_s``: see
    :meth:`_PendingBatches.flush`)."""
    _PENDING.flush(wait_s)


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
    fields, (history, score, member), kept = _batch_metrics(labels, plan_id, items, summary, now)
    warmed = {kept[0]: {kept[1]: kept[2]}} if kept is not None else {}
    with store.pipeline(transaction=False) as pipe:
        _queue_writes(pipe, fields, {history: {member: score}}, warmed)
        pipe.execute()
    return summary


def record_wal(store: redis.Redis, engine: str, outcome: str) -> None:
    """A WAL transaction ended outside a batch's own run (``recovered`` by a sweep or a retry)."""
    _SeriesWriter(store).add("prewarm_wal_transactions_total", (engine, outcome), 1)


def record_trigger(store: redis.Redis, engine: str, kind: str, fired: bool) -> bool:
    """A trigger of ``kind`` fired (``fired``) or met its cooldown; returns ``fired``."""
    name = "prewarm_trigger_firings_total" if fired else "prewarm_trigger_cooldown_skips_total"
    _SeriesWriter(store).add(name, (engine, kind), 1)
    return fired


def record_tick(
    store: redis.Redis,
    engine: str,
    ok: bool,
    interval_s: float | None = None,
    now: float | None = None,
) -> None:
    """The warm-up loop ticked for ``engine`` (``ok``: it read, planned and warmed);
    ``interval_s`` is its period (``schedule.window_s``), what the stalled-loop alert measures."""
    now = time.time() if now is None else now
    one = (engine,)
    with store.pipeline(transaction=False) as pipe:
        series = _SeriesWriter(pipe)
        series.add("prewarm_loop_ticks_total", (engine, "ok" if ok else "failed"), 1)
        series.set({
            ("prewarm_loop_last_tick_timestamp_seconds", one): now,
            ("prewarm_loop_interval_seconds", one): interval_s,
            ("prewarm_loop_last_success_timestamp_seconds", one): now if ok else None,
        })  # fmt: skip
        pipe.execute()


def _sample_from(raw: Any) -> EngineSample | None:
    if not raw:
        return None
    data = json.loads(raw)
    data["ttft_buckets"] = tuple(tuple(pair) for pair in data.get("ttft_buckets", ()))
    return EngineSample(**data)


def engine_interval(
    previous: EngineSample | None, current: EngineSample
) -> tuple[float | None, float | None]:
    """(hit rate, median TTFT) between two reads of an engine; None where unknown."""
    if previous is None:
        return None, None
    rate = interval_hit_rate(previous, current)
    buckets = bucket_delta(previous.ttft_buckets, current.ttft_buckets)
    return (rate[0] if rate else None), histogram_quantile(buckets, 0.5)


def record_engine_sample(
    store: redis.Redis, engine: str, sample: EngineSample | None, now: float | None = None
) -> None:
    """One read of ``engine``'s ``/metrics`` (None: it did not answer)."""
    now = time.time() if now is None else now
    state_key = f"{PREFIX}engine:{engine}"
    one = (engine,)
    if sample is None:
        _SeriesWriter(store).set({("prewarm_engine_up", one): 0})
        return
    previous = _sample_from(store.hget(state_key, "sample"))
    hit_rate, ttft = engine_interval(previous, sample)
    restarted = (
        previous is not None
        and None not in (previous.start_time, sample.start_time)
        and previous.start_time != sample.start_time
    )
    gauges = {
        "prewarm_engine_up": 1.0,
        "prewarm_engine_prefix_cache_hits_total": sample.prefix_hits,
        "prewarm_engine_prefix_cache_queries_total": sample.prefix_queries,
        "prewarm_engine_prefix_cache_hit_ratio": hit_rate,
        "prewarm_engine_ttft_p50_seconds": ttft,
        "prewarm_engine_start_time_seconds": sample.start_time,
    }
    with store.pipeline(transaction=False) as pipe:
        series = _SeriesWriter(pipe)
        series.set({(name, one): value for name, value in gauges.items()})
        pipe.hset(state_key, "sample", json.dumps(asdict(sample)))
        if restarted:
            series.add("prewarm_engine_restarts_total", one, 1)
            _history(pipe, engine, "restart", now, {"start_time": sample.start_time})
        _history(pipe, engine, "sample", now, {
            "hits": sample.prefix_hits, "queries": sample.prefix_queries, "hit_rate": hit_rate,
            "ttft_p50_s": ttft, "start_time": sample.start_time,
        }, trim=True)  # fmt: skip
        pipe.execute()


def warm_state(store: redis.Redis, engine: str) -> WarmState:
    """What prewarm warmed and planned for ``engine``, and when the engine last restarted."""
    with store.pipeline(transaction=False) as pipe:
        pipe.hgetall(f"{PREFIX}warmed:{engine}")
        pipe.hkeys(f"{PREFIX}planned:{engine}")
        pipe.hget(f"{PREFIX}engine:{engine}", "last_dropped")
        pipe.hget(SERIES, series_field("prewarm_engine_start_time_seconds", (engine,)))
        warmed, planned, dropped, start = pipe.execute()
    warmed_at: dict[str, float] = {}
    for raw in warmed.values():
        ts, keys = json.loads(raw)
        for key in keys:
            warmed_at[key] = max(ts, warmed_at.get(key, ts))
    return WarmState(
        warmed_at=warmed_at,
        planned=frozenset(_text(k) for k in planned),
        budget_cut=bool(dropped and int(float(dropped)) > 0),
        restarted_at=float(start) if start else None,
    )


def _trim_items(store: redis.Redis, engine: str) -> None:
    for kind, when in (("warmed", lambda v: json.loads(v)[0]), ("planned", float)):
        key = f"{PREFIX}{kind}:{engine}"
        if store.hlen(key) > MAX_ITEMS:
            entries = sorted(store.hgetall(key).items(), key=lambda kv: when(kv[1]))
            store.hdel(key, *[k for k, _ in entries[: len(entries) - MAX_ITEMS]])


def record_window(
    store: redis.Redis,
    engine: str,
    window: tuple[float, float],
    observed: Mapping[str, int],
    seen_before: Iterable[str],
    predicted: Mapping[str, float] | None = None,
) -> WindowOutcome:
    """A window closed: its coverage, misses by cause and the forecast's error, from what was
    warmed and planned (this store) and what the window's requests used (``observed``: requests
    per item key; ``seen_before``: item keys seen in earlier windows)."""
    outcome = window_outcome(window, observed, warm_state(store, engine), seen_before, predicted)
    one = (engine,)
    gauges: dict[Series, float | None] = {
        ("prewarm_warm_coverage_ratio", one): outcome.coverage,
        ("prewarm_forecast_absolute_error_requests", one): outcome.absolute_error,
        ("prewarm_forecast_relative_error_ratio", one): outcome.relative_error,
    }
    with store.pipeline(transaction=False) as pipe:
        series = _SeriesWriter(pipe)
        series.add("prewarm_window_requests_total", one, outcome.requests)
        series.add("prewarm_window_covered_requests_total", one, outcome.covered)
        for cause, count in outcome.misses.items():
            series.add("prewarm_window_misses_total", (engine, cause), count)
            gauges["prewarm_window_misses_requests", (engine, cause)] = count
        series.set(gauges)
        _history(pipe, engine, "window", window[1], outcome.to_dict(), trim=True)
        pipe.execute()
    _trim_items(store, engine)
    return outcome


# -- read side -----------------------------------------------------------------------------
def parse_series(raw: Mapping[Any, Any]) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """The ``series`` hash (as HGETALL returns it) by metric name: (label values, value).

    Fields of metrics this version does not know (an older or newer worker's) are skipped.
    """
    out: dict[str, list[tuple[tuple[str, ...], float]]] = {}
    for field, value in raw.items():
        name, labels = json.loads(field)
        if name in SPECS and len(labels) == len(SPECS[name].labels):
            out.setdefault(name, []).append((tuple(labels), float(value)))
    return out


def read_series(store: redis.Redis) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """Every stored series by metric name."""
    return parse_series(cast(Mapping[Any, Any], store.hgetall(SERIES)))


def history(
    store: redis.Redis, engine: str, since: float = 0.0, until: float | None = None
) -> list[dict[str, Any]]:
    """The engine's events between ``since`` and ``until``, oldest first."""
    high: float | str = "+inf" if until is None else until
    rows = cast(list[bytes], store.zrangebyscore(_history_key(engine), since, high))
    return [json.loads(raw) for raw in rows]


def engines_with_history(store: redis.Redis) -> list[str]:
    """Engines that have recorded history."""
    prefix = _history_key("")
    return sorted(_text(k)[len(prefix) :] for k in store.scan_iter(match=prefix + "*", count=1000))
