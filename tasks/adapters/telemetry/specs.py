"""The metric families the api exposes (:data:`SPECS`), their fields in the ``series`` hash, and
the names of the other telemetry keys in the store (the layout is in the package's docstring)."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tasks.adapters import redis_keys

PREFIX = redis_keys.METRICS
SERIES = PREFIX + "series"
#: History kept for the report: a week and a day.
HISTORY_S = 8 * 86400
#: Seconds an exiting process waits for a metrics write under way before it gives up.
EXIT_WAIT_S = 5.0
#: Committed batches and distinct planned items remembered per engine (oldest dropped first).
MAX_ITEMS = 50_000

#: a series: its metric's name and label values
Series = tuple[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family: its type, help text and label names."""

    kind: str  # "counter" | "gauge" | "histogram"
    help: str
    labels: tuple[str, ...]
    #: a histogram's bucket bounds (its series carry one more label: ``le:<bound>``, ``sum``,
    #: ``count``)
    buckets: tuple[float, ...] = ()

    @property
    def stored_labels(self) -> int:
        """How many label values a stored series of this family has."""
        return len(self.labels) + (1 if self.kind == "histogram" else 0)


ENGINE = ("engine",)
ER = ("engine", "reason")


def counter(help: str, labels: tuple[str, ...] = ENGINE) -> MetricSpec:
    """A counter family (labelled by engine unless told)."""
    return MetricSpec("counter", help, labels)


def gauge(help: str, labels: tuple[str, ...] = ENGINE) -> MetricSpec:
    """A gauge family (labelled by engine unless told)."""
    return MetricSpec("gauge", help, labels)


def histogram(help: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> MetricSpec:
    """A histogram family with ``buckets`` (seconds)."""
    return MetricSpec("histogram", help, labels, buckets)


#: time to ready of a gated replica: from milliseconds (a small hot set) to its deadline
GATE_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

SPECS: dict[str, MetricSpec] = {
    "prewarm_plans_total": counter("Warm-up plans submitted", ER),
    "prewarm_items_planned_total": counter("Items in submitted plans", ER),
    "prewarm_tokens_planned_total": counter("Prompt tokens in submitted plans", ER),
    "prewarm_items_dropped_total": counter("Candidates plans left out (budget)", ER),
    "prewarm_items_warmed_total": counter("Items applied by committed batches", ER),
    "prewarm_items_verified_total": counter("Items that passed verification", ER),
    "prewarm_items_failed_total": counter("Items that failed to warm or verify", ER),
    "prewarm_tokens_primed_total": counter("Prompt tokens of items warmed and verified", ER),
    "prewarm_batches_total": counter("Warm-up batches by outcome", ("engine", "reason", "outcome")),
    "prewarm_warm_seconds_total": counter("Seconds spent running batches", ER),
    "prewarm_wal_transactions_total": counter(
        "WAL transactions ended, by outcome (committed, rolled_back, recovered)",
        ("engine", "outcome"),
    ),
    "prewarm_trigger_firings_total": counter("Triggers that fired a warm-up", ("engine", "kind")),
    "prewarm_trigger_cooldown_skips_total": counter(
        "Triggers skipped while their cooldown ran", ("engine", "kind")
    ),
    "prewarm_loop_ticks_total": counter(
        "Warm-up loop ticks by outcome (ok, failed)", ("engine", "outcome")
    ),
    "prewarm_loop_interval_seconds": gauge("The loop's period (schedule.window_s)"),
    "prewarm_loop_last_tick_timestamp_seconds": gauge("When the loop last ticked"),
    "prewarm_loop_last_success_timestamp_seconds": gauge("When the loop last ticked successfully"),
    "prewarm_window_requests_total": counter("Requests of closed windows"),
    "prewarm_window_covered_requests_total": counter(
        "Requests of closed windows whose item was warm"
    ),
    "prewarm_window_misses_total": counter(
        "Requests whose item was not warm, by cause", ("engine", "cause")
    ),
    "prewarm_warm_coverage_ratio": gauge(
        "Share of the last closed window's requests whose item was warm"
    ),
    "prewarm_window_misses_requests": gauge(
        "Requests of the last closed window not warm, by cause", ("engine", "cause")
    ),
    "prewarm_forecast_absolute_error_requests": gauge(
        "Sum of |predicted - observed| requests over items, last closed window"
    ),
    "prewarm_forecast_relative_error_ratio": gauge(
        "Forecast absolute error over observed requests, last closed window"
    ),
    "prewarm_engine_up": gauge("Whether the engine answered its /metrics at the last watch"),
    "prewarm_engine_prefix_cache_hits_total": counter(
        "The engine's own vllm:prefix_cache_hits (tokens), as last read"
    ),
    "prewarm_engine_prefix_cache_queries_total": counter(
        "The engine's own vllm:prefix_cache_queries (tokens), as last read"
    ),
    "prewarm_engine_prefix_cache_hit_ratio": gauge(
        "The engine's prefix-cache hit rate between the last two reads"
    ),
    "prewarm_engine_ttft_p50_seconds": gauge(
        "The engine's median time to first token between the last two reads"
    ),
    "prewarm_engine_start_time_seconds": gauge(
        "The engine process's start time (a change is a restart)"
    ),
    "prewarm_engine_restarts_total": counter("Engine restarts seen by the watcher"),
    "prewarm_gateway_requests_total": counter(
        "Requests the engine's gateways logged (prewarm's own left out)"
    ),
    "prewarm_gateway_cache_hits_total": counter(
        "Requests the engine's gateways answered from their cache"
    ),
    "prewarm_gateway_cache_hit_ratio": gauge(
        "Share of the gateway requests read at the last tick answered from the gateway's cache"
    ),
    "prewarm_fleet_replica": gauge(
        "A fleet's replica at the last look (1; 0 once the fleet dropped it), with the road "
        "its warm-ups take",
        ("fleet", "engine", "policy", "road"),
    ),
    "prewarm_fleet_router_up": gauge("Whether the fleet's router answered /health", ("fleet",)),
    "prewarm_fleet_router_restarts_total": counter(
        "Restarts of the fleet's router seen by the watcher", ("fleet",)
    ),
    "prewarm_fleet_replicas_undiscoverable": gauge(
        "1 while a fleet that takes its replicas from its router (or DNS) cannot read them or "
        "reads none, else 0",
        ("fleet",),
    ),
    "prewarm_plan_items_unverified": gauge(
        "Items of the engine's last plan not verified (failed to warm, or not held where its "
        "users land)"
    ),
    "prewarm_gate_replica": gauge(
        "A gated replica's state (1 for the state it is in, 0 for the others)",
        ("fleet", "engine", "state"),
    ),
    "prewarm_gate_waiting": gauge(
        "Gated replicas of the fleet waiting now (out of the router's list, not Ready)",
        ("fleet",),
    ),
    "prewarm_gate_admitted_cold_total": counter(
        "Gated replicas admitted cold: their deadline (gate_deadline_s) passed before their "
        "hot set was verified",
        ("fleet",),
    ),
    "prewarm_gate_time_to_ready_seconds": histogram(
        "Seconds from a gated replica's detection to its admission", ("fleet",), GATE_BUCKETS
    ),
    "prewarm_gate_prewarm_seconds": histogram(
        "prewarm's own part of a gated replica's time to ready (detection, planning, dispatch, "
        "verification)",
        ("fleet",),
        GATE_BUCKETS,
    ),
    "prewarm_fleet_road_retries_total": counter(
        "Replicas warmed again through the router once it answered, after a warm-up through it "
        "failed while it was down",
        ("fleet",),
    ),
}


def series_field(name: str, labels: Sequence[str]) -> str:
    """The field of one series in the ``series`` hash."""
    return _field(name, tuple(labels))


@functools.lru_cache(maxsize=4096)  # labels are bounded (see the package docstring)
def _field(name: str, labels: tuple[str, ...]) -> str:
    return json.dumps([name, list(labels)], separators=(",", ":"))


# -- the other keys ------------------------------------------------------------------------
def plan_key(plan_id: str) -> str:
    """A submitted plan's labels ("engine<TAB>reason")."""
    return f"{PREFIX}plan:{plan_id}"


def history_key(engine: str) -> str:
    """The engine's events by time."""
    return f"{PREFIX}history:{engine}"


def warmed_key(engine: str) -> str:
    """The engine's committed batches' warmed item keys."""
    return f"{PREFIX}warmed:{engine}"


def planned_key(engine: str) -> str:
    """When a plan for the engine last named each item key."""
    return f"{PREFIX}planned:{engine}"


def engine_key(engine: str) -> str:
    """The engine's last sample and its last plan's dropped count."""
    return f"{PREFIX}engine:{engine}"


def text(raw: Any) -> str:
    """A value as Redis returned it (bytes or str), as text."""
    return raw.decode() if isinstance(raw, bytes) else str(raw)
