"""The call sites' writes, one line each at the call site and one round trip or two here: a plan
submitted, a WAL transaction recovered, a trigger fired or skipped, a loop tick, an engine read, a
window closed. A batch's own writes are in :mod:`.batches`."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

import redis

from pipeline.gate import GateState
from pipeline.intents.requests import IntentWindow
from pipeline.planner.plan import WarmItem, WarmPlan
from pipeline.triggers import EngineSample, bucket_delta, histogram_quantile, interval_hit_rate
from pipeline.window_outcome import WindowOutcome, window_outcome
from tasks.adapters.telemetry.read import warm_state
from tasks.adapters.telemetry.specs import (
    HISTORY_S,
    MAX_ITEMS,
    SERIES,
    SPECS,
    Series,
    engine_key,
    history_key,
    plan_key,
    planned_key,
    series_field,
    warmed_key,
)


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


def history_event(kind: str, ts: float, data: Mapping[str, Any]) -> str:
    """A history event as stored (a unique member of the history's sorted set)."""
    return json.dumps({"kind": kind, "ts": ts, **data, "id": os.urandom(4).hex()})


def _history(
    pipe: Any, engine: str, kind: str, ts: float, data: Mapping[str, Any], trim: bool = False
) -> None:
    """Add an event; ``trim`` (on the infrequent events) drops those older than the history."""
    pipe.zadd(history_key(engine), {history_event(kind, ts, data): ts})
    if trim:
        pipe.zremrangebyscore(history_key(engine), "-inf", ts - HISTORY_S)


def item_keys(items: Iterable[WarmItem]) -> list[str]:
    """The items' keys, in order."""
    return [item.key for item in items]


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
        pipe.set(plan_key(plan.plan_id), f"{engine}\t{reason}", ex=HISTORY_S)
        series = _SeriesWriter(pipe)
        series.add("prewarm_plans_total", labels, 1)
        series.add("prewarm_items_planned_total", labels, len(plan.items))
        series.add("prewarm_tokens_planned_total", labels, plan.tokens)
        series.add("prewarm_items_dropped_total", labels, plan.dropped)
        if plan.items:
            pipe.hset(planned_key(engine), mapping=dict.fromkeys(item_keys(plan.items), int(now)))
        pipe.hset(engine_key(engine), "last_dropped", plan.dropped)
        _history(pipe, engine, "plan", now, {
            "plan_id": plan.plan_id, "reason": reason, "items": len(plan.items),
            "tokens": plan.tokens, "dropped": plan.dropped,
        })  # fmt: skip
        pipe.execute()


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


# -- engine reads --------------------------------------------------------------------------
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


def _restarted(previous: EngineSample | None, current: EngineSample) -> bool:
    """Whether the engine's start time changed between two reads (both known)."""
    return (
        previous is not None
        and None not in (previous.start_time, current.start_time)
        and previous.start_time != current.start_time
    )


def record_engine_sample(
    store: redis.Redis, engine: str, sample: EngineSample | None, now: float | None = None
) -> None:
    """One read of ``engine``'s ``/metrics`` (None: it did not answer)."""
    now = time.time() if now is None else now
    one = (engine,)
    if sample is None:
        _SeriesWriter(store).set({("prewarm_engine_up", one): 0})
        return
    previous = _sample_from(store.hget(engine_key(engine), "sample"))
    hit_rate, ttft = engine_interval(previous, sample)
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
        pipe.hset(engine_key(engine), "sample", json.dumps(asdict(sample)))
        if _restarted(previous, sample):
            series.add("prewarm_engine_restarts_total", one, 1)
            _history(pipe, engine, "restart", now, {"start_time": sample.start_time})
        _history(pipe, engine, "sample", now, {
            "hits": sample.prefix_hits, "queries": sample.prefix_queries, "hit_rate": hit_rate,
            "ttft_p50_s": ttft, "start_time": sample.start_time,
        }, trim=True)  # fmt: skip
        pipe.execute()


# -- gateways ------------------------------------------------------------------------------
def record_gateway(
    store: redis.Redis,
    engine: str,
    windows: Sequence[tuple[float, int, int]],
    now: float | None = None,
) -> None:
    """What the engine's gateways answered, per window of requests read at a tick: (window
    start, requests, answered from the gateway's cache); the report's before/after reads
    these events."""
    if not windows:
        return
    now = time.time() if now is None else now
    one = (engine,)
    requests, hits = sum(w[1] for w in windows), sum(w[2] for w in windows)
    with store.pipeline(transaction=False) as pipe:
        series = _SeriesWriter(pipe)
        series.add("prewarm_gateway_requests_total", one, requests)
        series.add("prewarm_gateway_cache_hits_total", one, hits)
        series.set(
            {("prewarm_gateway_cache_hit_ratio", one): hits / requests if requests else None}
        )
        for start, n, cached in windows:
            data = {"requests": n, "hits": cached, "read": now}  # (two reads of one window)
            _history(pipe, engine, "gateway", start, data, trim=True)
        pipe.execute()


def record_intents(
    store: redis.Redis, engine: str, windows: Sequence[IntentWindow], now: float | None = None
) -> None:
    """A semantic gateway's requests and cache hits per intent in a closed window; the
    report's per-intent before/after reads these events."""
    if not windows:
        return
    now = time.time() if now is None else now
    with store.pipeline(transaction=False) as pipe:
        for window in windows:
            _history(pipe, engine, "intent", window.start, {**window.to_dict(), "read": now},
                     trim=True)  # fmt: skip
        pipe.execute()


# -- windows -------------------------------------------------------------------------------
def _trim_items(store: redis.Redis, engine: str) -> None:
    """Keep the newest :data:`MAX_ITEMS` of the engine's warmed batches and planned items."""
    for key, when in (
        (warmed_key(engine), lambda v: json.loads(v)[0]),
        (planned_key(engine), float),
    ):
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


def record_fleet(
    store: redis.Redis,
    fleet: str,
    replicas: Mapping[str, tuple[str, str]],
    dropped: Iterable[tuple[str, str, str]] = (),
    router_up: bool | None = None,
    router_restarted: bool = False,
    undiscoverable: bool | None = None,
) -> None:
    """One look at a fleet: its replicas (engine → (policy, road)), the ones it dropped (engine,
    policy, road), whether its router answered, whether it restarted, and whether its replicas
    could not be found (None: it does not look for them)."""
    gauges: dict[Series, float | None] = {
        ("prewarm_fleet_replica", (fleet, engine, policy, road)): 1.0
        for engine, (policy, road) in replicas.items()
    }
    gauges.update({("prewarm_fleet_replica", (fleet, *gone)): 0.0 for gone in dropped})
    if router_up is not None:
        gauges[("prewarm_fleet_router_up", (fleet,))] = 1.0 if router_up else 0.0
    if undiscoverable is not None:
        gauges[("prewarm_fleet_replicas_undiscoverable", (fleet,))] = float(undiscoverable)
    with store.pipeline(transaction=False) as pipe:
        series = _SeriesWriter(pipe)
        series.set(gauges)
        if router_restarted:
            series.add("prewarm_fleet_router_restarts_total", (fleet,), 1)
        pipe.execute()


def record_unverified(store: redis.Redis, unverified: Mapping[str, int]) -> None:
    """Items of each engine's last plan not verified (0: every item verified, or no plan)."""
    if not unverified:
        return
    with store.pipeline(transaction=False) as pipe:
        _SeriesWriter(pipe).set(
            {("prewarm_plan_items_unverified", (e,)): float(n) for e, n in unverified.items()}
        )
        pipe.execute()


def record_road_retries(store: redis.Redis, fleet: str, count: int) -> None:
    """Replicas of ``fleet`` warmed again through its router once it answered."""
    if count:
        with store.pipeline(transaction=False) as pipe:
            _SeriesWriter(pipe).add("prewarm_fleet_road_retries_total", (fleet,), count)
            pipe.execute()


def observe_histogram(
    series: _SeriesWriter, name: str, labels: Sequence[str], value: float
) -> None:
    """One observation of histogram ``name`` (its bucket counts, sum and count)."""
    spec = SPECS[name]
    for bound in spec.buckets:
        if value <= bound:
            series.add(name, (*labels, f"le:{bound:g}"), 1)
    series.add(name, (*labels, "sum"), value)
    series.add(name, (*labels, "count"), 1)


def record_gate(
    store: redis.Redis,
    fleet: str,
    states: Mapping[str, str],
    waiting: int,
    admitted: Sequence[tuple[float, float, bool]] = (),
) -> None:
    """One look of the gate at ``fleet``: the state of each replica it looked at (engine ->
    state), how many of the fleet's replicas wait now, and the replicas it admitted: (time to
    ready, prewarm's part, cold)."""
    gauges: dict[Series, float | None] = {
        ("prewarm_gate_replica", (fleet, engine, s.value)): float(s.value == state)
        for engine, state in states.items()
        for s in GateState
    }
    gauges[("prewarm_gate_waiting", (fleet,))] = float(waiting)
    with store.pipeline(transaction=False) as pipe:
        series = _SeriesWriter(pipe)
        series.set(gauges)
        for ready_s, prewarm_s, cold in admitted:
            observe_histogram(series, "prewarm_gate_time_to_ready_seconds", (fleet,), ready_s)
            observe_histogram(series, "prewarm_gate_prewarm_seconds", (fleet,), prewarm_s)
            if cold:
                series.add("prewarm_gate_admitted_cold_total", (fleet,), 1)
        pipe.execute()
