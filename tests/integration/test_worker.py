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
