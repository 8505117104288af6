"""A real worker on a real Redis answers on every queue."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_ping_task_round_trips_through_a_real_worker(celery_worker, celery_app_configured):
    result = celery_app_configured.send_task("prewarm.events.ping")
    answer = result.get(timeout=30)
    assert answer["pid"] == celery_worker.proc.pid or answer["pid"] > 0
    assert result.status == "SUCCESS"


def test_tasks_are_routed_to_their_queue(celery_app_configured):
    router = celery_app_configured.amqp.router
    route = router.route({}, "prewarm.warm.anything")
    assert route["queue"].name == "warm"


def test_a_routed_task_lands_in_its_own_queue_only(store_url, store):
    """Each queue has its own binding: nothing is copied into the other queues."""
    from celery import Celery

    from tasks.adapters.broker_queues import queue_keys
    from tasks.celery_app import QUEUES, celery_config
    from tasks.settings import load_settings

    client_app = Celery("route-check")
    client_app.conf.update(celery_config(load_settings({"PREWARM_REDIS_URL": store_url})))
    client_app.send_task("prewarm.ingest.file", args=["/nowhere"])
    client_app.send_task("prewarm.loop.warm", args=["engine", "cli"])

    def waiting(queue: str) -> list[int]:  # per priority step (its own list in Redis)
        return [store.llen(key) for key in queue_keys(queue)]

    lengths = {name: waiting(name) for name in QUEUES}
    # an ingest is routine work; "warm now" goes ahead of it on the same queue
    assert lengths == {"ingest": [1, 0, 1, 0], "model": [0] * 4, "warm": [0] * 4,
                       "events": [0] * 4}  # fmt: skip
