"""What a benchmark runs prewarm on: Redis databases of its own and real worker processes.

The databases are the integration tests' pair (``PREWARM_TEST_REDIS``, default
``redis://127.0.0.1:6379``; ``PREWARM_TEST_REDIS_DB`` = N for the broker, N + 1 for the store,
default 14), which nobody else uses and which a benchmark flushes. Workers are
:class:`jobs.embedded.WorkerProcess`: a subprocess, never eager mode.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from jobs.embedded import WorkerProcess

REDIS_BASE = os.environ.get("PREWARM_TEST_REDIS", "redis://127.0.0.1:6379")
REDIS_DB = int(os.environ.get("PREWARM_TEST_REDIS_DB", "14"))
BROKER_URL = f"{REDIS_BASE}/{REDIS_DB}"
STORE_URL = f"{REDIS_BASE}/{REDIS_DB + 1}"
REPO_ROOT = Path(__file__).resolve().parents[1]


def prewarm_environment(config: Path | None = None) -> dict[str, str]:
    """Environment of a worker or a CLI process: the benchmark's Redis databases and, when
    given, the settings file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    env.update(
        {"PREWARM_REDIS_URL": BROKER_URL, "PREWARM_STORE_URL": STORE_URL,
         "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
    )  # fmt: skip
    if config is not None:
        env["PREWARM_CONFIG"] = str(config)
    return env


def use_benchmark_redis() -> None:
    """Point this process's settings (and Celery app) at the benchmark's databases."""
    from tasks import settings as settings_module
    from tasks.celery_app import app, celery_config

    os.environ.update({"PREWARM_REDIS_URL": BROKER_URL, "PREWARM_STORE_URL": STORE_URL})
    settings_module.current_settings.cache_clear()
    app.conf.update(celery_config(settings_module.current_settings()))


def flush_databases() -> None:
    """Empty the broker and store databases (nobody else uses them)."""
    for url in (BROKER_URL, STORE_URL):
        redis.Redis.from_url(url).flushdb()


@contextmanager
def running_worker(
    log_path: Path, env: dict[str, str], queues: str | None = None, pool: str = "prefork"
) -> Iterator[WorkerProcess]:
    """A started, ready worker (on ``queues``, default every queue) for the block, on freshly
    flushed databases; stopped afterwards."""
    flush_databases()
    extra = {} if queues is None else {"queues": queues}
    worker = WorkerProcess(None, log_path, env=env, pool=pool, **extra)
    try:
        worker.wait_ready(180.0)  # a loaded 2-core machine starts a worker slowly
        yield worker
    finally:
        worker.stop()
