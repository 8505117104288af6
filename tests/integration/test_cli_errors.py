"""What a new user sees when something is missing: one line naming it, and a non-zero exit.

Every case runs the real ``prewarm`` console script in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA
from tests.integration.processes import free_port, prewarm_script

pytestmark = pytest.mark.integration


def prewarm(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    return subprocess.run(
        [prewarm_script(), *args],
        env={**base, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_one_line(result, *fragments: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("command", [["worker"], ["beat"], ["api"], ["health", "redis"]])
def test_unreachable_redis_is_one_line(command, tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = prewarm(*command, env={"PREWARM_REDIS_URL": url}, cwd=tmp_path)
    assert_one_line(result, "cannot reach", url, "PREWARM_REDIS_URL")


def test_missing_config_file_is_one_line(tmp_path):
    missing = tmp_path / "nope.toml"
    assert_one_line(prewarm("--config", str(missing), "health", "redis"), str(missing), "not found")


def test_malformed_config_file_names_the_file(tmp_path):
    bad = tmp_path / "prewarm.toml"
    bad.write_text('redis_url = "redis://localhost:6379/0"\n[budget\nmax_items = 3\n')
    result = prewarm("health", "redis", env={"PREWARM_CONFIG": str(bad)})
    assert_one_line(result, str(bad), "not valid TOML", "line 2")


def test_invalid_setting_names_the_key(tmp_path):
    bad = tmp_path / "prewarm.toml"
    bad.write_text('[budget]\nmax_items = "lots"\n')
    assert_one_line(prewarm("-c", str(bad), "health", "redis"), "budget.max_items")


def test_invalid_environment_value_names_the_key():
    result = prewarm("health", "redis", env={"PREWARM_REDIS_URL": "http://localhost:6379"})
    assert_one_line(result, "redis_url", "redis://")


def test_unknown_engine_name_is_one_line(tmp_path):
    config = tmp_path / "prewarm.toml"
    config.write_text('[[engines]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodel = "m"\n')
    assert_one_line(prewarm("-c", str(config), "health", "engine", "b"), "unknown engine 'b'", "a")


def test_unreachable_engine_url_is_one_line():
    url = f"http://127.0.0.1:{free_port()}"
    assert_one_line(prewarm("health", "engine", url), "cannot reach engine", url)


def test_unknown_queue_is_one_line():
    assert_one_line(prewarm("worker", "--queues", "warm,nope"), "--queues", "nope")


@pytest.fixture(scope="module")
def ingested(tmp_path_factory) -> Path:
    """An ingest output folder made from a real-format vLLM log, as a user would make it."""
    out = tmp_path_factory.mktemp("ingest")
    log = SHARED_DATA / "logs" / "examples" / "vllm-main-2026-08.txt"
    assert prewarm("ingest", str(log), "--out", str(out)).returncode == 0
    return out


def test_planning_for_an_unknown_engine_is_one_line(ingested, tmp_path):
    config = tmp_path / "prewarm.toml"
    config.write_text('[[engines]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodel = "m"\n')
    result = prewarm("-c", str(config), "plan", "--from", str(ingested), "--engine", "b")
    assert_one_line(result, "unknown engine 'b'")


def test_warming_without_redis_is_one_line(ingested, tmp_path):
    config = tmp_path / "prewarm.toml"
    config.write_text('[[engines]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodel = "m"\n')
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = prewarm(
        "-c", str(config), "warm", "--from", str(ingested), "--engine", "a",
        env={"PREWARM_REDIS_URL": url},
    )  # fmt: skip
    assert_one_line(result, "cannot reach", url)
