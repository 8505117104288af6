"""Cold-cache triggers: hit-rate drop, spikes on the Azure code trace, key drift, replicas."""

from __future__ import annotations

import itertools
import random

import pytest

from pipeline.triggers import (
    Cooldown,
    DriftDetector,
    EngineSample,
    HitRateDropDetector,
    ReplicaObservation,
    SpikeDetector,
    bucket_delta,
    counter_delta,
    entropy,
    histogram_quantile,
    js_divergence,
    replica_event,
)
from tests.conftest import SHARED_DATA

AZURE_CODE = SHARED_DATA / "traces" / "AzureLLMInferenceTrace_code.csv"


def _scrapes(rates, queries_per=200, start=0.0):
    queries = hits = 0.0
    out = []
    for i, rate in enumerate(rates):
        queries += queries_per
        hits += queries_per * rate
        out.append(EngineSample("e", start + i * 10, prefix_queries=queries, prefix_hits=hits))
    return out


def test_hit_rate_drop_fires_on_a_drop_not_on_noise():
    detector = HitRateDropDetector(drop=0.4)
    steady = [0.8 + 0.03 * ((-1) ** i) for i in range(20)]
    assert [detector.observe(s) for s in _scrapes(steady)] == [None] * 20
    detector = HitRateDropDetector(drop=0.4)
    events = [detector.observe(s) for s in _scrapes([*steady, 0.2])]
    fired = [e for e in events if e]
    assert len(fired) == 1 and fired[0].detail["hit_rate"] == pytest.approx(0.2)


def test_hit_rate_handles_counter_reset_and_idle_intervals():
    assert counter_delta(100, 30) == 30 and counter_delta(None, 5) is None
    detector = HitRateDropDetector(min_queries=50)
    samples = [*_scrapes([0.8] * 5), EngineSample("e", 60, prefix_queries=10, prefix_hits=1)]
    assert all(detector.observe(s) is None for s in samples)  # 10 queries: too few to judge


def test_histogram_quantile_matches_prometheus_interpolation():
    buckets = [(0.1, 10.0), (0.5, 60.0), (1.0, 100.0), (float("inf"), 100.0)]
    assert histogram_quantile(buckets, 0.5) == pytest.approx(0.1 + 0.4 * (40 / 50))
    assert histogram_quantile([(0.1, 0.0)], 0.5) is None
    assert bucket_delta([(0.1, 5.0)], [(0.1, 7.0), (1.0, 9.0)]) == [(0.1, 2.0), (1.0, 9.0)]


def _azure_counts(window: str = "10s"):
    from pipeline.ingest.traces import read_azure

    frame = read_azure(AZURE_CODE)
    return frame.set_index("ts").resample(window).size()


@pytest.mark.skipif(not AZURE_CODE.exists(), reason="shared Azure trace not present")
def test_spikes_on_the_azure_code_trace():
    counts = _azure_counts()
    detector, cooldown = SpikeDetector(windows=12, ratio=3.0, k=3.0), Cooldown(60)
    fired = []
    for ts, count in counts.items():
        event = cooldown.allow(detector.observe("e", ts.timestamp(), float(count)))
        if event:
            fired.append(event)
    values = counts.to_numpy()
    assert 1 <= len(fired) < len(values) / 6
    # Each firing window really is a burst against the trailing 12 windows.
    for event in fired:
        index = list(counts.index.map(lambda t: t.timestamp())).index(event.ts)
        trailing = values[index - 12 : index]
        assert values[index] >= 3 * trailing.mean() and values[index] >= 20
    # The largest burst of the trace is caught (or falls inside a cooldown that a burst began).
    peak = counts.idxmax().timestamp()
    assert any(0 <= peak - e.ts < 60 for e in fired)
    times = [e.ts for e in fired]
    assert all(b - a >= 60 for a, b in itertools.pairwise(times))


@pytest.mark.skipif(not AZURE_CODE.exists(), reason="shared Azure trace not present")
def test_no_spikes_when_the_same_requests_arrive_evenly():
    counts = _azure_counts()
    rng = random.Random(7)
    mean = counts.mean()
    detector = SpikeDetector(windows=12, ratio=3.0, k=3.0)
    even = [sum(rng.random() < mean / 100 for _ in range(100)) for _ in range(len(counts))]
    assert all(detector.observe("e", float(i), float(c)) is None for i, c in enumerate(even))


def test_cooldown_limits_a_storm():
    detector, cooldown = SpikeDetector(windows=3, ratio=2.0, k=1.0, min_count=5), Cooldown(30)
    series = [10, 10, 10, 100, 100, 400, 10, 10, 10, 10]
    fired = [cooldown.allow(detector.observe("e", i * 10.0, c)) for i, c in enumerate(series)]
    raw = SpikeDetector(windows=3, ratio=2.0, k=1.0, min_count=5)
    raw_fired = [raw.observe("e", i * 10.0, c) for i, c in enumerate(series)]
    assert sum(e is not None for e in raw_fired) > sum(e is not None for e in fired) >= 1


def test_entropy_and_divergence():
    assert entropy({"a": 1, "b": 1}) == pytest.approx(1.0)
    assert entropy({"a": 5}) == 0.0
    assert js_divergence({"a": 1}, {"b": 1}) == pytest.approx(1.0)
    assert js_divergence({"a": 2, "b": 2}, {"a": 1, "b": 1}) == pytest.approx(0.0)


def test_drift_fires_when_traffic_moves_to_new_keys():
    rng = random.Random(3)
    detector = DriftDetector(windows=4, threshold=0.35)

    def window(keys):
        counts: dict[str, float] = {}
        for _ in range(300):
            key = rng.choice(keys)
            counts[key] = counts.get(key, 0) + 1
        return counts

    old_keys = [f"k{i}" for i in range(20)]
    stable = [detector.observe("e", float(i), window(old_keys)) for i in range(10)]
    assert stable == [None] * 10
    moved = detector.observe("e", 10.0, window([f"n{i}" for i in range(5)]))
    assert moved is not None and moved.detail["entropy"] < moved.detail["baseline_entropy"]


def test_replica_ready_and_restart():
    down = ReplicaObservation("e", 0, healthy=False)
    up = ReplicaObservation("e", 10, healthy=True, models=("m",), start_time=1000.0)
    same = ReplicaObservation("e", 20, healthy=True, models=("m",), start_time=1000.0)
    restarted = ReplicaObservation("e", 30, healthy=True, models=("m",), start_time=1025.0)
    loading = ReplicaObservation("e", 5, healthy=True, models=())
    assert replica_event(None, down) is None
    assert replica_event(down, loading) is None
    assert replica_event(down, up).kind == "replica_ready"
    assert replica_event(None, up).kind == "replica_ready"
    assert replica_event(up, same) is None
    assert replica_event(same, restarted).kind == "replica_restarted"


def test_stats_line_rows_feed_the_hit_rate_detector():
    import pandas as pd

    from pipeline.triggers import samples_from_stats

    times = pd.date_range("2025-01-01", periods=12, freq="10s", tz="UTC")
    rates = [0.7] * 11 + [0.1]
    rows = [
        {"ts": t, "instance": "vllm-0", "prefix_cache_hit_rate": r, "waiting": 3.0}
        for t, r in zip(times, rates, strict=True)
    ]
    rows.insert(3, {"ts": times[3], "instance": "vllm-0", "running": 2.0})  # a row without a rate
    samples = samples_from_stats(rows)
    assert len(samples) == 12 and samples[0].engine == "vllm-0"
    detector = HitRateDropDetector(drop=0.4)
    fired = [e for e in map(detector.observe, samples) if e]
    assert (
        len(fired) == 1
        and fired[0].ts == times[-1].timestamp()
        and fired[0].detail["waiting"] == 3.0
    )


def test_drift_over_window_counts_of_records():
    import pandas as pd

    from pipeline.records import records_frame
    from pipeline.triggers import drift_events
    from pipeline.windows import item_window_counts

    rng = random.Random(5)
    start = pd.Timestamp("2025-01-01", tz="UTC")
    rows = []
    for minute in range(120):
        topics = (
            [f"old topic {i}" for i in range(15)]
            if minute < 90
            else [f"new topic {i}" for i in range(3)]
        )
        for n in range(20):
            prompt = f"{rng.choice(topics)} question {n}"
            rows.append(
                {
                    "ts": start + pd.Timedelta(minutes=minute, seconds=n),
                    "prompt": prompt,
                    "prefix_hashes": [prompt.split(" question")[0]],
                }
            )
    counts = item_window_counts(records_frame(rows), window="10min")
    raw = drift_events(counts, "prefix", detector=DriftDetector(windows=3, threshold=0.35))
    assert raw and pd.Timestamp(raw[0].ts, unit="s", tz="UTC") == start + pd.Timedelta(minutes=90)
    assert all(e.ts >= raw[0].ts for e in raw)  # nothing before the shift
    calm = drift_events(
        counts, "prefix", detector=DriftDetector(windows=3, threshold=0.35), cooldown=Cooldown(3600)
    )
    assert [e.ts for e in calm] == [raw[0].ts]
