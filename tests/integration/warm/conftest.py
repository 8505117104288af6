"""Fixtures for warm-up integration tests: a simulator, settings naming it, a worker using them.

The worker consumes a queue of its own, so a session worker started by other tests (which
does not know the simulator) never takes these tasks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from jobs.embedded import WorkerProcess
from jobs.simulator import LatencyModel, SimulatorConfig, SimulatorServer
from pipeline.planner.plan import PlanBudget, WarmItem, WarmPlan, new_plan_id
from tasks.settings import Settings, load_settings
from tests.conftest import BROKER_URL, STORE_URL, worker_env

ADAPTERS = [f"lora-{n}" for n in range(24)]
MODEL = "sim-llm"


def write_config(path: Path, engine_url: str, lease_s: int = 1) -> Path:
    """A TOML settings file with one engine, ``sim``, at ``engine_url``."""
    adapters = ", ".join(f'"{name}=adapters/{name}"' for name in ADAPTERS)
    path.write_text(
        f'wal_lease_s = {lease_s}\n\n[[engines]]\nname = "sim"\nurl = "{engine_url}"\n'
        f'model = "{MODEL}"\nkind = "simulator"\nmax_concurrency = 8\n'
        f"adapters = [{adapters}]\n"
    )
    return path


def settings_for(config: Path) -> Settings:
    env = {"PREWARM_REDIS_URL": BROKER_URL, "PREWARM_STORE_URL": STORE_URL}
    return load_settings(environ=env, config_path=config)


def start_worker(log: Path, config: Path, queue: str, concurrency: int = 2) -> WorkerProcess:
    worker = WorkerProcess(config, log, concurrency, env=worker_env(), queues=queue)
    worker.wait_ready()
    return worker


@pytest.fixture(scope="package")
def sim() -> Iterator[SimulatorServer]:
    """A simulator with a small fixed cost per request (2 ms), so batches take a moment."""
    config = SimulatorConfig(model=MODEL, latency=LatencyModel(0.0, 0.0, 2.0))
    with SimulatorServer(config) as server:
        yield server


@pytest.fixture(scope="package")
def warm_config(sim: SimulatorServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_config(tmp_path_factory.mktemp("warm") / "prewarm.toml", sim.url)


@pytest.fixture(scope="package")
def warm_settings(warm_config: Path) -> Settings:
    return settings_for(warm_config)


@pytest.fixture(scope="package")
def warm_queue() -> str:
    return f"warm-test-{os.getpid()}"


@pytest.fixture(scope="package")
def warm_worker(
    broker_url: str, celery_app_configured, warm_config: Path, warm_queue: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:  # fmt: skip
    worker = start_worker(tmp_path_factory.mktemp("wlog") / "worker.log", warm_config, warm_queue)
    try:
        yield worker
    finally:
        worker.stop()


def prefix_item(n: int, tag: str) -> WarmItem:
    text = f"System {tag} {n}: you answer questions about invoices, politely. " * 6
    return WarmItem("prefix", f"{tag}-prefix-{n}", MODEL, text=text, tokens=60)


def adapter_item(name: str) -> WarmItem:
    return WarmItem("adapter", f"adapter-{name}", MODEL, adapter=name)


def plan_of(items: list[WarmItem], batch_size: int = 16) -> WarmPlan:
    return WarmPlan(new_plan_id(), "sim", tuple(items), PlanBudget(batch_size=batch_size))


def engine_prompt_tokens(sim: SimulatorServer) -> float:
    """The simulator's ``vllm:prompt_tokens_total`` (grows with every request it serves)."""
    text = httpx.get(sim.url + "/metrics").text
    match = re.search(r"^vllm:prompt_tokens_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    assert match, "simulator /metrics has no prompt token counter"
    return float(match.group(1))
