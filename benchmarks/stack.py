"""What a benchmark runs prewarm on: Redis databases of its own and real worker processes.

The databases are the integration tests' pair (``PREWARM_TEST_REDIS``, default
``redis://127.0.0.1:6379``; ``PREWARM_TEST_REDIS_DB`` = N for the broker, N + 1 for the store,
default 14), which nobody else uses and which a benchmark flushes. Workers are
:class:`jobs.embedded.WorkerProcess`: a subprocess, never eager mode.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


def timed_plan(plan: Any, settings: Any, queue: str, worker: Any) -> tuple[float, float]:
    """Submit ``plan`` to ``queue`` and wait for it: (items per wall second, items per CPU second
    of ``worker``, a psutil process). Every item must succeed."""
    from tasks.adapters.targets.base import WarmOptions
    from tasks.warm_tasks import submit_plan, wait_plan

    n = len(plan.items)
    cpu_before = sum(worker.cpu_times()[:2])
    started = time.perf_counter()
    options = WarmOptions(batch_size=plan.budget.batch_size)
    plan_id = submit_plan(plan, settings=settings, options=options, queue=queue)
    report = wait_plan(plan_id, 600, settings=settings, poll_s=0.05)
    elapsed = time.perf_counter() - started
    cpu = sum(worker.cpu_times()[:2]) - cpu_before
    if report["items_ok"] != n:
        raise SystemExit(f"plan {plan_id}: {report}")
    return n / elapsed, n / max(cpu, 1e-6)


def in_process_submitter(store: Any, settings: Any, ordered: bool = True) -> Any:
    """A plan submitter for the loop (``WarmLoop(submit=...)``) that runs every batch of the plan
    here, through the real batch runner and WAL, instead of on a worker."""
    from tasks.adapters.plan_store import PlanStore
    from tasks.adapters.targets.base import WarmOptions
    from tasks.services.batch_runner import BatchRunner

    def submit(plan: Any, engine: str) -> str:
        plans = PlanStore(store)
        batches = plans.save(plan, engine, WarmOptions(plan.budget.batch_size, ordered=ordered))
        runner = BatchRunner(store, settings)
        for batch in range(batches):
            runner.run(plan.plan_id, batch)
        plans.mark_finished(plan.plan_id)
        return str(plan.plan_id)

    return submit
