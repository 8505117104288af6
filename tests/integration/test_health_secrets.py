"""``prewarm health engine`` never prints an engine URL's password, and a URL with a control
character is refused by the settings in one line naming the key (real CLI, real simulator)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.embedded import free_port
from jobs.simulator import SimulatorConfig, SimulatorServer
from tests.integration.processes import prewarm_script

pytestmark = pytest.mark.integration
SECRET = "hunter2-s3cret"


def prewarm(*args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    if config is not None:
        env["PREWARM_CONFIG"] = str(config)
    return subprocess.run(
        [prewarm_script(), *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(model="sim-llm")) as server:
        yield server


def _config(path: Path, url: str) -> Path:
    path.write_text(f'[[engines]]\nname = "a"\nurl = {json.dumps(url)}\nmodel = "sim-llm"\n')
    return path


def _with_credentials(url: str) -> str:
    return url.replace("http://", f"http://ops:{SECRET}@")


def test_success_line_masks_the_password(sim, tmp_path):
    config = _config(tmp_path / "c.toml", _with_credentials(sim.url))
    result = prewarm("health", "engine", "a", config=config)
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout + result.stderr
    assert "ops:***@127.0.0.1" in result.stdout and "sim-llm" in result.stdout


def test_url_on_the_command_line_is_masked_too(sim):
    result = prewarm("health", "engine", _with_credentials(sim.url))
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout + result.stderr and "ops:***@" in result.stdout


def test_error_line_masks_the_password(tmp_path):
    url = f"http://ops:{SECRET}@127.0.0.1:{free_port()}"
    result = prewarm("health", "engine", "a", config=_config(tmp_path / "c.toml", url))
    assert result.returncode == 2
    assert SECRET not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach engine at http://ops:***@127.0.0.1" in lines[0]


@pytest.mark.parametrize("control", ["\r", "\n", "\r\n"])
def test_control_character_in_a_configured_url_is_one_line(tmp_path, control):
    url = f"http://ops:{SECRET}@127.0.0.1:8000/{control}Host: elsewhere"
    result = prewarm("health", "engine", "a", config=_config(tmp_path / "c.toml", url))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "engines.0.url" in lines[0] and "control character" in lines[0]
    assert "Traceback" not in result.stderr and SECRET not in result.stderr


def test_control_character_in_a_command_line_url_is_one_line():
    result = prewarm("health", "engine", f"http://ops:{SECRET}@127.0.0.1:8000/\r\nX: y")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert SECRET not in result.stderr


def test_a_worker_never_logs_an_engine_password(sim, tmp_path, celery_app_configured):
    from jobs.embedded import WorkerProcess
    from tasks.adapters.targets.base import WarmOptions
    from tasks.warm_tasks import submit_plan, wait_plan
    from tests.conftest import worker_env
    from tests.integration.warm.conftest import plan_of, prefix_item, settings_for, write_config

    config = write_config(tmp_path / "prewarm.toml", _with_credentials(sim.url))
    queue = f"secrets-{os.getpid()}"
    worker = WorkerProcess(config, tmp_path / "worker.log", env=worker_env(), queues=queue)
    try:
        worker.wait_ready(120)
        plan = plan_of([prefix_item(n, "secret") for n in range(2)])
        settings = settings_for(config)
        plan_id = submit_plan(plan, settings=settings, options=WarmOptions(), queue=queue)
        assert wait_plan(plan_id, 60, settings=settings)["committed"] == 1
    finally:
        worker.stop()
    log = worker.log_text()
    assert "HTTP Request" in log and "ops:***@127.0.0.1" in log  # httpx logs every request
    assert SECRET not in log
