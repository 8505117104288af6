"""A plan through real workers, a real Redis and the simulator: commit, failure, redelivery."""

from __future__ import annotations

import time

import httpx
import pytest

from tasks.adapters.plan_store import PlanStore
from tasks.adapters.targets.base import WarmOptions
from tasks.warm_tasks import batch_results, plan_report, submit_plan, wait_plan
from tests.integration.warm.conftest import (
    adapter_item,
    engine_prompt_tokens,
    plan_of,
    prefix_item,
)

pytestmark = pytest.mark.integration


def _loaded(sim) -> set[str]:
    return {card["id"] for card in httpx.get(sim.url + "/v1/models").json()["data"]}


def test_a_plan_commits_primes_and_is_served(sim, warm_worker, warm_settings, warm_queue, store):
    items = [prefix_item(n, "flow") for n in range(7)] + [adapter_item("lora-0")]
    plan = plan_of(items, batch_size=4)
    plan_id = submit_plan(plan, settings=warm_settings, queue=warm_queue)
    report = wait_plan(plan_id, 60, settings=warm_settings)
    failures = [r["failures"] for r in batch_results(plan_id, settings=warm_settings)]
    assert report["batches"] == 2 and report["committed"] == 2, failures
    assert report["items_ok"] == len(items) and report["items_failed"] == 0
    assert "lora-0" in _loaded(sim)
    # the primed prefixes are in the engine's cache now
    body = {"model": "sim-llm", "prompt": items[0].text, "max_tokens": 1}
    probe = httpx.post(sim.url + "/v1/completions", json=body).json()
    assert probe["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


@pytest.mark.parametrize("fault", ["http_500", "timeout"])
def test_engine_failures_are_retried_then_rolled_back(
    fault, sim, warm_worker, warm_settings, warm_queue, store
):
    items = [prefix_item(n, f"fail-{fault}") for n in range(4)]
    faults = sim.engine.config.faults
    # one prompt per request, so every item's request is counted on its own
    options = WarmOptions(retry_attempts=3, retry_base_s=0.01, timeout_s=0.3,
                          prompts_per_request=1)  # fmt: skip
    try:
        if fault == "http_500":
            faults.error_rate = 1.0
        else:
            faults.delay_s = 1.0
        plan_id = submit_plan(
            plan_of(items), settings=warm_settings, options=options, queue=warm_queue
        )
        report = wait_plan(plan_id, 60, settings=warm_settings)
    finally:
        faults.error_rate, faults.delay_s = 0.0, 0.0
    [result] = batch_results(plan_id, settings=warm_settings)
    assert report["rolled_back"] == 1 and result["state"] == "rolled_back"
    assert result["engine_requests"] == 3 * len(items)  # every request tried 3 times
    assert warm_worker.proc.poll() is None
    # the same worker carries on once the engine is healthy again
    again = submit_plan(plan_of(items), settings=warm_settings, queue=warm_queue)
    assert wait_plan(again, 60, settings=warm_settings)["committed"] == 1


def test_a_redelivered_task_does_no_work_twice(sim, warm_worker, warm_settings, warm_queue, store,
                                               celery_app_configured):  # fmt: skip
    sim.engine.config.faults.delay_s = 0.05  # overlap the duplicate with the first delivery
    try:
        plan = plan_of([prefix_item(n, "dup") for n in range(3)])
        plan_id = submit_plan(plan, settings=warm_settings, queue=warm_queue)
        duplicate = celery_app_configured.send_task(
            "prewarm.warm.batch", (plan_id, 0), queue=warm_queue
        )
        wait_plan(plan_id, 60, settings=warm_settings)
        answer = duplicate.get(timeout=60)
    finally:
        sim.engine.config.faults.delay_s = 0.0
    served = engine_prompt_tokens(sim)
    late = celery_app_configured.send_task("prewarm.warm.batch", (plan_id, 0), queue=warm_queue)
    assert late.get(timeout=30)["duplicate"] is True
    assert PlanStore(store).runs(plan_id) == {0: 1}  # work started once for three deliveries
    assert answer["state"] == "committed"
    assert engine_prompt_tokens(sim) == served
    assert plan_report(plan_id, settings=warm_settings)["batches_done"] == 1
    time.sleep(0)  # keep the worker's log readable on failure


def test_a_plan_with_a_token_budget_runs_batch_after_batch(
    sim, warm_worker, warm_settings, warm_queue, store
):
    items = [prefix_item(n, "ordered") for n in range(8)]
    plan = plan_of(items, batch_size=2)
    plan = plan.__class__(plan.plan_id, plan.engine, plan.items,
                          plan.budget.__class__(batch_size=2, max_tokens=10_000))  # fmt: skip
    sim.engine.config.faults.delay_s = 0.02  # long enough that parallel batches would overlap
    try:
        plan_id = submit_plan(plan, settings=warm_settings, queue=warm_queue)
        assert wait_plan(plan_id, 60, settings=warm_settings)["committed"] == 4
    finally:
        sim.engine.config.faults.delay_s = 0.0
    txns = [r["txn"] for r in batch_results(plan_id, settings=warm_settings)]
    spans = [(float(store.hget(f"pw:wal:txn:{t}", "created")),
              float(store.hget(f"pw:wal:txn:{t}", "ended"))) for t in txns]  # fmt: skip
    assert all(spans[n + 1][0] >= spans[n][1] for n in range(3)), spans
