"""Cold-cache triggers (pure): hit-rate drops, request-rate spikes, key drift, replica start-up
(topic drift: :mod:`pipeline.topic_drift`).

Detectors see one observation at a time (a metrics scrape, a window of counts) and keep only a
short rolling baseline, so a watcher can run them forever. Each trigger kind has a cooldown per
engine, so a flapping signal warms once, not on every scrape.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

HIT_RATE_DROP = "hit_rate_drop"
REQUEST_SPIKE = "request_spike"
KEY_DRIFT = "key_drift"
TOPIC_DRIFT = "topic_drift"
REPLICA_READY = "replica_ready"
REPLICA_RESTARTED = "replica_restarted"


@dataclass(frozen=True, slots=True)
class TriggerEvent:
    """Something happened that calls for a warm-up of ``engine``."""

    kind: str
    engine: str
    ts: float
    detail: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (task messages, logs)."""
        return {
            "kind": self.kind,
            "engine": self.engine,
            "ts": self.ts,
            "detail": dict(self.detail),
        }


class Cooldown:
    """At most one event per (kind, engine) every ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.last: dict[tuple[str, str], float] = {}

    def allow(self, event: TriggerEvent | None) -> TriggerEvent | None:
        """``event`` if its cooldown has passed (and start a new one), else None."""
        if event is None:
            return None
        key = (event.kind, event.engine)
        if event.ts - self.last.get(key, -math.inf) < self.seconds:
            return None
        self.last[key] = event.ts
        return event


def counter_delta(previous: float | None, current: float | None) -> float | None:
    """Increase of a Prometheus counter; a decrease means it restarted from zero."""
    if previous is None or current is None:
        return None
    return current - previous if current >= previous else current


# --- engine metrics -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One scrape of an engine's ``/metrics`` (vLLM names), or a stats line from its log."""

    engine: str
    ts: float
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    waiting: float | None = None
    requests: float | None = None
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    start_time: float | None = None
    hit_rate: float | None = None  # when only a rate is known (a log stats line)


def interval_hit_rate(previous: EngineSample, current: EngineSample) -> tuple[float, float] | None:
    """(hit rate, queries) over the interval between two scrapes, from the counters."""
    queries = counter_delta(previous.prefix_queries, current.prefix_queries)
    hits = counter_delta(previous.prefix_hits, current.prefix_hits)
    if queries is None or hits is None or queries <= 0:
        return None
    return min(1.0, max(0.0, hits / queries)), queries


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """Quantile of a cumulative histogram (``le``, count) by linear interpolation, as PromQL."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank, lower_le, lower_count = q * ordered[-1][1], 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return lower_le
            span = count - lower_count
            return lower_le + (le - lower_le) * ((rank - lower_count) / span if span else 1.0)
        lower_le, lower_count = le, count
    return ordered[-1][0]


def bucket_delta(
    previous: Sequence[tuple[float, float]], current: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """Per-interval cumulative buckets (a restart resets them)."""
    before = dict(previous)
    return [(le, counter_delta(before.get(le, 0.0), count) or 0.0) for le, count in current]


class HitRateDropDetector:
    """Fires when the interval hit rate falls ``drop`` (relative) below its EWMA baseline."""

    def __init__(
        self,
        drop: float = 0.4,
        min_queries: float = 50,
        alpha: float = 0.2,
        min_baseline: float = 0.1,
    ) -> None:
        self.drop, self.min_queries, self.alpha, self.min_baseline = (
            drop,
            min_queries,
            alpha,
            min_baseline,
        )
        self.baseline: float | None = None
        self.previous: EngineSample | None = None

    def _rate(self, sample: EngineSample) -> tuple[float, float] | None:
        if sample.hit_rate is not None:
            return sample.hit_rate, self.min_queries
        return interval_hit_rate(self.previous, sample) if self.previous else None

    def observe(self, sample: EngineSample) -> TriggerEvent | None:
        """Feed one scrape; returns an event on a drop."""
        measured, self.previous = self._rate(sample), sample
        if measured is None or measured[1] < self.min_queries:
            return None
        rate, queries = measured
        baseline = self.baseline
        self.baseline = (
            rate if baseline is None else (1 - self.alpha) * baseline + self.alpha * rate
        )
        if baseline is None or baseline < self.min_baseline or rate >= baseline * (1 - self.drop):
            return None
        detail = {"hit_rate": round(rate, 4), "baseline": round(baseline, 4), "queries": queries}
        if sample.waiting is not None:
            detail["waiting"] = sample.waiting
        return TriggerEvent(HIT_RATE_DROP, sample.engine, sample.ts, detail)


class SpikeDetector:
    """Fires when a window's request count is far above the rolling baseline of past windows.

    A spike needs all of: ``count >= ratio × mean``, ``count >= mean + k × std`` and
    ``count >= min_count`` (the last keeps near-idle engines quiet).
    """

    def __init__(
        self, windows: int = 12, ratio: float = 3.0, k: float = 3.0, min_count: int = 20
    ) -> None:
        self.ratio, self.k, self.min_count = ratio, k, min_count
        self.history: deque[float] = deque(maxlen=windows)

    def baseline(self) -> tuple[float, float] | None:
        """Mean and standard deviation of the windows seen (None until the history is full)."""
        if len(self.history) < (self.history.maxlen or 0):
            return None
        mean = sum(self.history) / len(self.history)
        var = sum((x - mean) ** 2 for x in self.history) / len(self.history)
        return mean, math.sqrt(var)

    def observe(self, engine: str, ts: float, count: float) -> TriggerEvent | None:
        """Feed one window's request count."""
        base = self.baseline()
        self.history.append(count)
        if base is None:
            return None
        mean, std = base
        if count < self.min_count or count < self.ratio * mean or count < mean + self.k * std:
            return None
        detail = {"count": count, "baseline_mean": round(mean, 3), "baseline_std": round(std, 3)}
        return TriggerEvent(REQUEST_SPIKE, engine, ts, detail)


# --- key distribution ---------------------------------------------------------------------------


def _distribution(counts: Mapping[str, float]) -> dict[str, float]:
    total = sum(v for v in counts.values() if v > 0)
    return {k: v / total for k, v in counts.items() if v > 0} if total else {}


def entropy(counts: Mapping[str, float]) -> float:
    """Shannon entropy (bits) of a key distribution given as counts."""
    return -sum(p * math.log2(p) for p in _distribution(counts).values())


def js_divergence(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Jensen-Shannon divergence (bits, 0..1) between two count distributions."""
    p, q = _distribution(a), _distribution(b)
    if not p or not q:
        return 0.0
    keys = set(p) | set(q)
    m = {k: (p.get(k, 0.0) + q.get(k, 0.0)) / 2 for k in keys}

    def kl(x: Mapping[str, float]) -> float:
        return sum(v * math.log2(v / m[k]) for k, v in x.items())

    return (kl(p) + kl(q)) / 2


class DriftDetector:
    """Fires when a window's key distribution moves away from the last ``windows`` pooled.

    Distance is the Jensen-Shannon divergence; the entropy of both sides goes in the detail,
    since a drop in entropy (traffic concentrating on new keys) is what an operator looks at.
    """

    def __init__(self, windows: int = 6, threshold: float = 0.35, min_requests: int = 50) -> None:
        self.threshold, self.min_requests = threshold, min_requests
        self.history: deque[dict[str, float]] = deque(maxlen=windows)

    def _pooled(self) -> dict[str, float]:
        pooled: dict[str, float] = {}
        for window in self.history:
            for key, count in window.items():
                pooled[key] = pooled.get(key, 0.0) + count
        return pooled

    def observe(self, engine: str, ts: float, counts: Mapping[str, float]) -> TriggerEvent | None:
        """Feed one window's request counts per key."""
        full = len(self.history) == self.history.maxlen
        baseline = self._pooled()
        if sum(counts.values()) >= self.min_requests:
            self.history.append(dict(counts))
        if not full or sum(counts.values()) < self.min_requests:
            return None
        distance = js_divergence(counts, baseline)
        if distance < self.threshold:
            return None
        detail = {
            "js_divergence": round(distance, 4),
            "entropy": round(entropy(counts), 4),
            "baseline_entropy": round(entropy(baseline), 4),
        }
        return TriggerEvent(KEY_DRIFT, engine, ts, detail)


# --- replica start-up ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaObservation:
    """One look at a replica: ``/health``, ``/v1/models`` and its process start time."""

    engine: str
    ts: float
    healthy: bool
    models: tuple[str, ...] = ()
    start_time: float | None = None

    @property
    def ready(self) -> bool:
        """Healthy and serving at least one model."""
        return self.healthy and bool(self.models)


def replica_event(
    previous: ReplicaObservation | None, current: ReplicaObservation
) -> TriggerEvent | None:
    """``replica_ready`` when a replica becomes ready, ``replica_restarted`` when its process
    start time moved while it looked ready all along (a restart between two polls)."""
    if not current.ready:
        return None
    detail = {"models": list(current.models), "start_time": current.start_time}
    if previous is None or not previous.ready:
        return TriggerEvent(REPLICA_READY, current.engine, current.ts, detail)
    moved = (
        previous.start_time is not None
        and current.start_time is not None
        # Any change: scrapes of one process report the very same start time.
        and current.start_time != previous.start_time
    )
    return TriggerEvent(REPLICA_RESTARTED, current.engine, current.ts, detail) if moved else None


def samples_from_stats(rows: Iterable[Mapping[str, Any]]) -> list[EngineSample]:
    """Engine samples from the stats-line metrics rows of an ingested vLLM log.

    Those lines carry a hit *rate* (not counters) and the waiting queue, once per interval.
    """
    samples = []
    for row in rows:
        rate, ts = row.get("prefix_cache_hit_rate"), row.get("ts")
        if rate is None or ts is None or (isinstance(rate, float) and math.isnan(rate)):
            continue
        stamp = ts.timestamp() if hasattr(ts, "timestamp") else float(ts)
        waiting = row.get("waiting")
        samples.append(
            EngineSample(
                str(row.get("instance", "log")), stamp, waiting=waiting, hit_rate=float(rate)
            )
        )
    return samples


def drift_events(
    counts: pd.DataFrame,
    item_kind: str = "prefix",
    engine: str = "fleet",
    detector: DriftDetector | None = None,
    cooldown: Cooldown | None = None,
) -> list[TriggerEvent]:
    """Key-drift events over item × window counts (``pipeline.windows`` counts shape)."""
    detector = detector or DriftDetector()
    rows = counts[counts["item_kind"] == item_kind]
    events = []
    for window_start, window in rows.groupby("window_start", sort=True):
        keyed = dict(zip(window["item_key"], window["requests"].astype(float), strict=True))
        event = detector.observe(engine, pd.Timestamp(window_start).timestamp(), keyed)
        if cooldown is not None:
            event = cooldown.allow(event)
        if event is not None:
            events.append(event)
    return events


def window_requests(counts: pd.DataFrame) -> pd.Series:
    """Requests per window from item × window counts (each request has exactly one model item)."""
    models = counts[counts["item_kind"] == "model"]
    return models.groupby("window_start", sort=True)["requests"].sum()


def log_signals(
    metrics: Iterable[Mapping[str, Any]],
    counts: pd.DataFrame,
    engine: str = "fleet",
    cooldown_s: float = 300.0,
) -> list[TriggerEvent]:
    """Every trigger event an ingested log shows: hit-rate drops per instance (stats lines),
    request spikes and key drift per window (counts), each kind with its own cooldown."""
    cooldown = Cooldown(cooldown_s)
    events: list[TriggerEvent] = []
    per_instance: dict[str, HitRateDropDetector] = {}
    for sample in sorted(samples_from_stats(metrics), key=lambda s: s.ts):
        # vLLM's stats-line rate is over its last 1,000 requests, so a cache gone cold shows as
        # a slide, not a step: a smaller drop against a slower baseline catches it.
        detector = per_instance.setdefault(
            sample.engine, HitRateDropDetector(drop=0.25, alpha=0.05)
        )
        event = cooldown.allow(detector.observe(sample))
        events.extend([event] if event else [])
    spikes = SpikeDetector()
    for window_start, count in window_requests(counts).items():
        ts = pd.Timestamp(window_start).timestamp()
        event = cooldown.allow(spikes.observe(engine, ts, float(count)))
        events.extend([event] if event else [])
    events.extend(drift_events(counts, "prefix", engine, cooldown=cooldown))
    return sorted(events, key=lambda e: e.ts)
