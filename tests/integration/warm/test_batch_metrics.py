"""A batch's metrics: counted once its commit holds, written by the worker's writer within
``metrics_flush_s`` (or at once on a flush), the same series as when every batch wrote its own."""

from __future__ import annotations

import pytest

from pipeline.planner.plan import WarmItem, WarmPlan, new_plan_id
from pipeline.triggers import EngineSample
from tasks.adapters import telemetry
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.targets.base import WarmOptions
from tasks.services.batch_runner import BatchRunner
from tasks.settings import METRICS_FLUSH_S, current_settings
from tests.integration.warm.conftest import plan_of, prefix_item

pytestmark = pytest.mark.integration


def _series(store) -> dict[str, dict[tuple[str, ...], float]]:
    telemetry.flush_batch_metrics()
    return {name: dict(rows) for name, rows in telemetry.read_series(store).items()}


def test_a_committed_batch_counts_once_with_its_commit(sim, warm_settings, store):
    items = [prefix_item(n, "metrics") for n in range(3)]
    plan = plan_of(items, batch_size=8)
    PlanStore(store).save(plan, "sim", WarmOptions(batch_size=8))
    telemetry.record_plan(store, plan, "sim", reason="replica")
    runner = BatchRunner(store, warm_settings)
    assert runner.run(plan.plan_id, 0)["state"] == "committed"
    assert runner.run(plan.plan_id, 0)["duplicate"]  # a redelivery is not counted again
    series, labels = _series(store), ("sim", "replica")
    assert series["prewarm_batches_total"] == {(*labels, "committed"): 1.0}
    assert series["prewarm_items_warmed_total"] == {labels: 3.0}
    assert series["prewarm_items_verified_total"] == {labels: 3.0}
    assert series["prewarm_items_failed_total"] == {labels: 0.0}
    assert series["prewarm_tokens_primed_total"] == {labels: 180.0}
    assert series["prewarm_wal_transactions_total"] == {("sim", "committed"): 1.0}
    assert series["prewarm_warm_seconds_total"][labels] > 0
    assert set(telemetry.warm_state(store, "sim").warmed_at) == {item.key for item in items}
    kinds = [event["kind"] for event in telemetry.history(store, "sim")]
    assert kinds == ["plan", "batch"]


def test_a_rolled_back_batch_counts_its_failures(sim, warm_settings, store):
    items = [prefix_item(n, "metrics-fail") for n in range(2)]
    plan = plan_of(items)
    options = WarmOptions(retry_attempts=1, timeout_s=0.5, prompts_per_request=1)
    PlanStore(store).save(plan, "sim", options)
    sim.engine.config.faults.error_rate = 1.0
    try:
        summary = BatchRunner(store, warm_settings).run(plan.plan_id, 0)
    finally:
        sim.engine.config.faults.error_rate = 0.0
    assert summary["state"] == "rolled_back"
    series, labels = _series(store), ("sim", "cli")  # stored without submit: reason cli
    assert series["prewarm_batches_total"] == {(*labels, "rolled_back"): 1.0}
    assert series["prewarm_items_failed_total"] == {labels: 2.0}
    assert series["prewarm_items_warmed_total"] == {labels: 0.0}
    assert series["prewarm_wal_transactions_total"] == {("sim", "rolled_back"): 1.0}
    assert telemetry.warm_state(store, "sim").warmed_at == {}


def test_every_record_writes_the_series_it_always_wrote(store):
    item = WarmItem("prefix", "k1", "m", text="x", tokens=7)
    plan = WarmPlan(new_plan_id(), "e", (item,), dropped=2)
    telemetry.record_plan(store, plan, "e", reason="window", now=100.0)
    telemetry.record_wal(store, "e", "recovered")
    telemetry.record_trigger(store, "e", "replica_ready", fired=True)
    telemetry.record_trigger(store, "e", "replica_ready", fired=False)
    telemetry.record_tick(store, "e", ok=False, interval_s=300, now=200.0)
    telemetry.record_tick(store, "e", ok=True, now=250.0)
    sample = EngineSample("e", 300.0, prefix_queries=100.0, prefix_hits=40.0, start_time=5.0)
    telemetry.record_engine_sample(store, "e", sample, now=300.0)
    later = EngineSample("e", 310.0, prefix_queries=200.0, prefix_hits=120.0, start_time=6.0)
    telemetry.record_engine_sample(store, "e", later, now=310.0)
    telemetry.record_engine_sample(store, "f", None, now=310.0)
    telemetry.record_window(store, "e", (0.0, 300.0), {"k1": 3, "new": 1}, ["k1"], {"k1": 2.0})
    one, er = ("e",), ("e", "window")
    misses = {("e", cause): 0.0 for cause in ("never_planned", "cut_by_budget", "evicted")}
    misses |= {("e", "warmed_late"): 3.0, ("e", "new"): 1.0}
    assert _series(store) == {
        "prewarm_plans_total": {er: 1.0},
        "prewarm_items_planned_total": {er: 1.0},
        "prewarm_tokens_planned_total": {er: 7.0},
        "prewarm_items_dropped_total": {er: 2.0},
        "prewarm_wal_transactions_total": {("e", "recovered"): 1.0},
        "prewarm_trigger_firings_total": {("e", "replica_ready"): 1.0},
        "prewarm_trigger_cooldown_skips_total": {("e", "replica_ready"): 1.0},
        "prewarm_loop_ticks_total": {("e", "failed"): 1.0, ("e", "ok"): 1.0},
        "prewarm_loop_interval_seconds": {one: 300.0},
        "prewarm_loop_last_tick_timestamp_seconds": {one: 250.0},
        "prewarm_loop_last_success_timestamp_seconds": {one: 250.0},
        "prewarm_engine_up": {one: 1.0, ("f",): 0.0},
        "prewarm_engine_prefix_cache_hits_total": {one: 120.0},
        "prewarm_engine_prefix_cache_queries_total": {one: 200.0},
        "prewarm_engine_prefix_cache_hit_ratio": {one: 0.8},
        "prewarm_engine_start_time_seconds": {one: 6.0},
        "prewarm_engine_restarts_total": {one: 1.0},
        "prewarm_window_requests_total": {one: 4.0},
        "prewarm_window_covered_requests_total": {one: 0.0},
        "prewarm_window_misses_total": misses,
        "prewarm_window_misses_requests": misses,
        "prewarm_warm_coverage_ratio": {one: 0.0},
        "prewarm_forecast_absolute_error_requests": {one: 2.0},
        "prewarm_forecast_relative_error_ratio": {one: 0.5},
    }


@pytest.fixture
def deferred(monkeypatch):
    """Batch metrics deferred (the default), whatever the environment says."""
    monkeypatch.setenv("PREWARM_METRICS_FLUSH_S", str(METRICS_FLUSH_S))
    current_settings.cache_clear()
    yield
    monkeypatch.undo()
    current_settings.cache_clear()


def test_a_bad_flush_interval_is_a_settings_error_naming_it():
    from pipeline.errors import SettingsError
    from tasks.settings import load_settings

    with pytest.raises(SettingsError, match="metrics_flush_s"):
        load_settings({"PREWARM_METRICS_FLUSH_S": "soon"})
    with pytest.raises(SettingsError, match="metrics_flush_s"):
        load_settings({"PREWARM_METRICS_FLUSH_S": "-1"})


def _labels_count(store, name: str, labels: tuple[str, ...]) -> float:
    return dict(telemetry.read_series(store).get(name, {})).get(labels, 0.0)


def test_the_writer_thread_writes_a_batch_without_being_asked(store):
    import time

    item = WarmItem("prefix", "k-thread", "m", text="x", tokens=5)
    summary = {"state": "committed", "items": 1, "ok": 1, "failed": 0, "batch": 0}
    telemetry.defer_batch(store, ("thread", "cli"), "p-thread", [item], summary)
    deadline = time.monotonic() + 10 * METRICS_FLUSH_S
    while time.monotonic() < deadline:
        if _labels_count(store, "prewarm_items_warmed_total", ("thread", "cli")) == 1.0:
            break
        time.sleep(0.05)
    assert _labels_count(store, "prewarm_items_warmed_total", ("thread", "cli")) == 1.0
    assert _labels_count(store, "prewarm_tokens_primed_total", ("thread", "cli")) == 5.0


def test_metrics_a_failed_write_kept_are_written_with_the_next(store):
    import redis

    from jobs.embedded import free_port

    down = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
    summary = {"state": "committed", "items": 2, "ok": 2, "failed": 0, "batch": 0}
    items = [WarmItem("prefix", f"k-down-{n}", "m", text="x", tokens=3) for n in range(2)]
    telemetry.flush_batch_metrics()  # nothing of other tests pending
    telemetry.defer_batch(down, ("down", "cli"), "p-down", items, summary)
    with pytest.raises(redis.ConnectionError):
        telemetry.flush_batch_metrics()
    telemetry.defer_batch(store, ("down", "cli"), "p-down", items, {**summary, "batch": 1})
    telemetry.flush_batch_metrics()
    assert _labels_count(store, "prewarm_items_warmed_total", ("down", "cli")) == 4.0
    assert _labels_count(store, "prewarm_batches_total", ("down", "cli", "committed")) == 2.0
    assert len(telemetry.warm_state(store, "down").warmed_at) == 2


def test_an_exit_flush_does_not_wait_past_its_bound_for_a_write_under_way(store, deferred):
    item = WarmItem("prefix", "k-bound", "m", text="x", tokens=2)
    summary = {"state": "committed", "items": 1, "ok": 1, "failed": 0, "batch": 0}
    telemetry.flush_batch_metrics()
    pending = telemetry.PENDING_BATCHES
    assert pending.writing.acquire(timeout=5)  # a write under way (a hung Redis, say)
    try:
        telemetry.defer_batch(store, ("bound", "cli"), "p-bound", [item], summary)
        telemetry.flush_batch_metrics(wait_s=0.05)  # returns without writing
        assert _labels_count(store, "prewarm_items_warmed_total", ("bound", "cli")) == 0.0
    finally:
        pending.writing.release()
    telemetry.flush_batch_metrics()
    assert _labels_count(store, "prewarm_items_warmed_total", ("bound", "cli")) == 1.0
