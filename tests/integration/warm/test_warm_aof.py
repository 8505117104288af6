"""Redis (prewarm's store) killed and restarted mid-plan with the append-only file on:
committed batches (their results and WAL records) survive, the batch in flight is retried, the
plan completes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from jobs.embedded import EmbeddedRedis, WorkerProcess
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.targets.base import WarmOptions
from tasks.adapters.wal_store import WalStore
from tasks.settings import load_settings
from tasks.warm_tasks import batch_results, plan_report, submit_plan, wait_plan
from tests.conftest import BROKER_URL, worker_env
from tests.integration.warm.conftest import plan_of, prefix_item, write_config

pytestmark = pytest.mark.integration


def _content(store: redis.Redis, key: str | bytes) -> object:
    """What a key holds, by its type (a reload from the append-only file may encode it anew)."""
    kind = store.type(key).decode()
    read = {"string": store.get, "hash": store.hgetall,
            "list": lambda k: store.lrange(k, 0, -1), "set": store.smembers,
            "zset": lambda k: store.zrange(k, 0, -1, withscores=True)}  # fmt: skip
    return kind, read[kind](key) if kind in read else None


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A redis-server with the append-only file on, fsync on every write."""
    server = EmbeddedRedis(tmp_path, appendonly=True).start()
    try:
        yield server
    finally:
        server.stop()


def test_committed_batches_survive_a_redis_crash_mid_plan(
    sim, aof_redis, broker_url, celery_app_configured, tmp_path
):
    config = write_config(tmp_path / "prewarm.toml", sim.url)
    env = {"PREWARM_REDIS_URL": BROKER_URL, "PREWARM_STORE_URL": aof_redis.url()}
    settings = load_settings(environ=env, config_path=config)
    queue = f"warm-aof-{time.monotonic_ns()}"
    env = worker_env({"PREWARM_STORE_URL": aof_redis.url()})
    worker = WorkerProcess(config, tmp_path / "worker.log", env=env, queues=queue)
    store = redis.Redis.from_url(aof_redis.url())
    try:
        worker.wait_ready()
        # one prompt per request: each batch takes a few of the engine's delayed answers
        options = WarmOptions(batch_size=2, prompts_per_request=1)
        first = submit_plan(plan_of([prefix_item(n, "aof1") for n in range(6)], batch_size=2),
                            settings=settings, options=options, queue=queue)  # fmt: skip
        assert wait_plan(first, 60, settings=settings)["committed"] == 3
        wal_keys = [*store.scan_iter("pw:wal:txn:*"), *store.scan_iter("pw:wal:fx:*")]
        # the first plan's transactions and batch results
        committed = {k: _content(store, k) for k in [*wal_keys, f"pw:plan:{first}:done"]}
        sim.engine.config.faults.delay_s = 0.06
        items = [prefix_item(n, "aof2") for n in range(16)]
        second = submit_plan(plan_of(items, batch_size=2), settings=settings, options=options,
                             queue=queue)  # fmt: skip
        deadline = time.monotonic() + 60
        while plan_report(second, settings=settings)["committed"] < 2:
            assert time.monotonic() < deadline, "the second plan never got going"
            time.sleep(0.01)
        done_before = {r["batch"] for r in batch_results(second, settings=settings)}
        aof_redis.crash()
        time.sleep(0.3)
        aof_redis.start()
        sim.engine.config.faults.delay_s = 0.0
        for key, value in committed.items():
            assert _content(store, key) == value, key
        survivors = {r["batch"] for r in batch_results(second, settings=settings)}
        assert done_before <= survivors
        report = wait_plan(second, 90, settings=settings)
        assert report["committed"] == 8 and report["rolled_back"] == 0
        assert report["items_ok"] == len(items)
        assert WalStore(store).summary()["open"] == 0
        assert max(PlanStore(store).runs(second).values()) <= 2
        assert worker.proc.poll() is None
    finally:
        sim.engine.config.faults.delay_s = 0.0
        worker.stop()
