"""A warm-up a trigger asks for goes ahead of the routine work queued before it: a real Celery
worker, started once four window ticks and then one "warm now" wait on its queue, runs the
"warm now" first (Redis priorities: ``tasks.celery_app``). On a fleet of many replicas the ticks
of every window queue up on ``ingest``, and a restarted replica's warm-up used to wait behind
them. The tasks are for an engine that is not configured: each fails at once, and its end time
in the result backend gives the order."""

from __future__ import annotations

import uuid

import pytest

from jobs.embedded import WorkerProcess
from tests.conftest import worker_env

pytestmark = pytest.mark.integration


def test_a_warm_now_runs_before_the_window_ticks_queued_ahead_of_it(
    celery_app_configured, tmp_path
):
    import tasks.loop_tasks  # noqa: F401  (registered here, as in beat: a task's own options apply)
    from tasks.celery_app import WARM_NOW, app

    queue = f"priority-{uuid.uuid4().hex[:8]}"
    ticks = [app.send_task("prewarm.loop.tick", ("no-such-engine", 0.0), queue=queue)
             for _ in range(4)]  # fmt: skip
    # (as beat and the API send them, by name: the routes give each its priority)
    urgent = app.send_task(WARM_NOW, ("no-such-engine", "replica_restarted"), queue=queue)
    worker = WorkerProcess(None, tmp_path / "worker.log", 1, env=worker_env(), queues=queue)
    try:
        worker.wait_ready()
        for result in (*ticks, urgent):
            result.get(timeout=120, propagate=False)
    finally:
        worker.stop()
    assert urgent.state == "FAILURE" and all(t.state == "FAILURE" for t in ticks)
    assert "no-such-engine" in str(urgent.result)
    assert urgent.date_done < min(t.date_done for t in ticks), worker.log_text()[-3000:]
