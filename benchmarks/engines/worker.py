"""A real Celery worker for the prewarm arm, bound to the test Redis (``PREWARM_TEST_REDIS_DB``).

It is the test suite's own :class:`tests.conftest.WorkerProcess`, so the benchmark runs prewarm
exactly as the integration tests do: a subprocess on every queue, never eager mode.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from tests.conftest import BROKER_URL, STORE_URL, WorkerProcess, worker_env


def prewarm_environment(config: Path) -> dict[str, str]:
    """Environment of the worker and the CLI: test Redis databases and the settings file."""
    return worker_env({"PREWARM_CONFIG": str(config)})


def flush_test_databases() -> None:
    """Empty the broker and store databases (nobody else uses them)."""
    for url in (BROKER_URL, STORE_URL):
        redis.Redis.from_url(url).flushdb()


@contextmanager
def running_worker(log_path: Path, env: dict[str, str]) -> Iterator[WorkerProcess]:
    """A started, ready worker for the duration of the block; stopped afterwards."""
    flush_test_databases()
    worker = WorkerProcess(log_path, env=env)
    try:
        worker.wait_ready(timeout=120.0)
        yield worker
    finally:
        worker.stop()
