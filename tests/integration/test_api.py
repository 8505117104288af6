"""The api service over real HTTP: health reflects Redis, metrics are Prometheus text."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from jobs.embedded import free_port
from tests.conftest import worker_env
from tests.integration.processes import prewarm_script, wait_for_http

pytestmark = pytest.mark.integration


@pytest.fixture
def api_url(store_url, tmp_path):
    """``prewarm api`` with the flushed store database as its broker: no worker consumes there,
    so the test can fill a queue without feeding garbage to a session worker."""
    port = free_port()
    env = worker_env({"PREWARM_REDIS_URL": store_url})
    proc = subprocess.Popen(
        [prewarm_script(), "api", "--port", str(port)], env=env, cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(f"{url}/health", proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


def test_health_answers_ok_when_redis_answers(api_url):
    response = httpx.get(f"{api_url}/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["redis"]["broker"] == "ok"


def test_metrics_expose_queue_depths_and_redis_state(api_url, store):
    store.rpush("warm", "x", "y")
    store.rpush("warm:6", "z")  # a routine message: its priority's own list
    text = httpx.get(f"{api_url}/metrics").text
    assert 'prewarm_queue_length{queue="warm"} 3.0' in text
    assert 'prewarm_redis_up{role="broker"} 1.0' in text


def test_webhook_routes_are_mounted(api_url):
    response = httpx.post(f"{api_url}/webhooks/github", content=b"{}")
    assert response.status_code not in (404, 405)


def test_health_is_503_naming_redis_when_it_is_down():
    from starlette.testclient import TestClient

    from jobs.api import build_api
    from tasks.settings import Settings

    url = f"redis://127.0.0.1:{free_port()}/0"
    with TestClient(build_api(Settings(redis_url=url))) as client:
        response = client.get("/health")
    assert response.status_code == 503
    assert url in response.json()["redis"]["broker"]


def test_metrics_expose_the_clusters_warm_up_telemetry_from_the_store(api_url, store):
    from pipeline.planner.plan import WarmItem, WarmPlan, new_plan_id
    from tasks.adapters import telemetry

    item = WarmItem("prefix", "k1", "m", text="x", tokens=7)
    plan = WarmPlan(new_plan_id(), "e", (item,), dropped=2)
    telemetry.record_plan(store, plan, "e", reason="window")  # as another worker would
    telemetry.record_trigger(store, "e", "replica_ready", fired=False)
    text = httpx.get(f"{api_url}/metrics").text
    assert 'prewarm_plans_total{engine="e",reason="window"} 1.0' in text
    assert 'prewarm_tokens_planned_total{engine="e",reason="window"} 7.0' in text
    assert 'prewarm_items_dropped_total{engine="e",reason="window"} 2.0' in text
    assert 'prewarm_trigger_cooldown_skips_total{engine="e",kind="replica_ready"} 1.0' in text
    assert "prewarm_store_up 1.0" in text and "prewarm_wal_open_transactions 0.0" in text
    assert "k1" not in text  # item keys are never labels


def test_metrics_say_when_the_store_is_down(store_url):
    from starlette.testclient import TestClient

    from jobs.api import build_api
    from tasks.settings import Settings

    down = f"redis://127.0.0.1:{free_port()}/0"
    with TestClient(build_api(Settings(redis_url=store_url, store_url=down))) as client:
        text = client.get("/metrics").text
    assert "prewarm_store_up 0.0" in text
    assert 'prewarm_redis_up{role="broker"} 1.0' in text
