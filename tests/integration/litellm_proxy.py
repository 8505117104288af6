"""LiteLLM's proxy (from PyPI, started from its own CLI with a config file) for gateway tests,
with its own Redis as its cache and prewarm's callback writing its request log.

The proxy runs in whatever environment holds ``litellm[proxy]``: ``PREWARM_TEST_LITELLM`` names
its ``litellm`` command, else the one on ``PATH``. LiteLLM's dependencies pin versions the
models extra cannot share (``huggingface_hub<2``), so without either the tests bring their own:
a virtual environment under ``.prewarm/litellm-venv`` with :data:`LITELLM` from PyPI, made once
(under a file lock). The callback needs no prewarm install there, only this repository on
``PYTHONPATH``. Where that cannot be made the tests are skipped on a laptop and fail in CI.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest
import redis

from jobs.embedded import EmbeddedRedis, free_port
from tasks.services.status import loop_status
from tests.conftest import REPO_ROOT
from tests.integration.processes import stop_process

MASTER_KEY = "sk-prewarm-test"


#: What the tests' own LiteLLM environment installs (the version the gateway tests were run on).
LITELLM = "litellm[proxy]==1.108.7"
#: Where the tests make that environment (git ignores ``.prewarm/``).
OWN_VENV = REPO_ROOT / ".prewarm" / "litellm-venv"


def litellm_command() -> str:
    """The ``litellm`` CLI to run (the tests' own environment is made when there is none), or a
    skip (a failure in CI) naming what is missing."""
    command = os.environ.get("PREWARM_TEST_LITELLM") or shutil.which("litellm")
    if command and Path(command).exists():
        return command
    made, why = _own_litellm()
    if made is not None:
        return made
    message = f"no litellm command ({why}; or set PREWARM_TEST_LITELLM)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _own_litellm() -> tuple[str | None, str]:
    """The ``litellm`` of the tests' own environment, made once; else None and why not."""
    command = OWN_VENV / "bin" / "litellm"
    OWN_VENV.parent.mkdir(parents=True, exist_ok=True)
    with (OWN_VENV.parent / "litellm-venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one maker; the others wait and find it made
        if command.exists():
            return str(command), ""
        steps = (
            [sys.executable, "-m", "venv", str(OWN_VENV)],
            [str(OWN_VENV / "bin" / "python"), "-m", "pip", "install", "-q", LITELLM],
        )
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=1200)
            if done.returncode != 0:
                shutil.rmtree(OWN_VENV, ignore_errors=True)
                return None, f"{' '.join(step[-2:])} failed: {done.stderr.strip()[-300:]}"
    return (str(command), "") if command.exists() else (None, f"{LITELLM} has no litellm command")


class CacheRedis(EmbeddedRedis):
    """The proxy's own Redis (its cache; emptied as a deploy empties it)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder / "proxy-redis")
        self.start()
        self.client = redis.Redis.from_url(self.url())

    def entries(self, namespace: str) -> set[str]:
        """Cache entries under ``namespace`` (LiteLLM's rate-limit counters, ``{…}``, left out)."""
        keys = (k.decode() for k in self.client.scan_iter(match=f"{namespace}:*", count=1000))
        return {k for k in keys if "{" not in k}


def proxy_config(engine_url: str, models: list[str], cache: CacheRedis, namespace: str,
                 ttl_s: int) -> str:  # fmt: skip
    """The proxy's config: each model group served by the engine, Redis cache on, prewarm's
    callback logging every request."""
    lines = ["model_list:"]
    for model in models:
        lines += [f"  - model_name: {model}", "    litellm_params:",
                  "      model: openai/sim-llm", f"      api_base: {engine_url}/v1",
                  "      api_key: none"]  # fmt: skip
    lines += [
        "litellm_settings:", "  cache: true", "  cache_params:", "    type: redis",
        "    host: 127.0.0.1", f"    port: {cache.port}", f"    namespace: {namespace}",
        f"    ttl: {ttl_s}", '  callbacks: ["jobs.litellm_log.request_log"]',
        "general_settings:", f"  master_key: {MASTER_KEY}",
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


class LitellmProxy:
    """``litellm --config FILE --port P`` on loopback, its request log at ``log_path``."""

    def __init__(self, folder: Path, config: str, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.folder = folder
        self.config_file = folder / "litellm.yaml"
        self.config_file.write_text(config)
        self.output = folder / "litellm.out"
        self._start()

    def _start(self) -> None:
        env = dict(os.environ)
        # the bundled model-cost map: offline, fetching it costs ~10 s of every start
        env.update({"PYTHONPATH": str(REPO_ROOT), "PREWARM_LITELLM_LOG": str(self.log_path),
                    "LITELLM_LOCAL_MODEL_COST_MAP": "True"})  # fmt: skip
        self._out = self.output.open("ab")
        self.proc = subprocess.Popen(
            [litellm_command(), "--config", str(self.config_file), "--host", "127.0.0.1",
             "--port", str(self.port)],
            cwd=self.folder, env=env, stdout=self._out, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def restart(self) -> float:
        """Stop and start the proxy on the same port (its in-memory cache is gone); seconds
        until it answers again."""
        self.stop()
        self._start()
        return self.wait_ready()

    def wait_ready(self, timeout_s: float = 120.0) -> float:
        """Seconds until ``/health/liveliness`` answered 200."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            assert self.proc.poll() is None, self.output.read_text(errors="replace")[-3000:]
            try:
                if httpx.get(f"{self.url}/health/liveliness", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"proxy not ready in {timeout_s}s")

    def post(self, route: str, body: dict, request_id: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {MASTER_KEY}", "X-Request-Id": request_id}
        response = httpx.post(f"{self.url}{route}", json=body, headers=headers, timeout=60)
        return response.raise_for_status()

    def stop(self) -> None:
        stop_process(self.proc)
        self._out.close()


def gateway_settings(
    path: Path, data_dir: Path, window_s: int, sim_url: str, proxy: LitellmProxy,
    cache_url: str, gateway: str,
) -> Path:  # fmt: skip
    """prewarm's settings at ``path``: the simulator at ``sim_url`` whose source is the proxy's
    request log, and the proxy as its gateway ``edge`` (``gateway``: the entry's further lines)."""
    path.write_text(f"""
data_dir = "{data_dir}"

[schedule]
window_s = {window_s}

[budget]
max_items = 200

[[engines]]
name = "sim"
url = "{sim_url}"
model = "sim-llm"
kind = "simulator"
cache_tokens = 65536
cache_block_tokens = 16

[[sources]]
engine = "sim"
kind = "litellm"
path = "{proxy.log_path}"

[[gateways]]
name = "edge"
kind = "litellm"
url = "{proxy.url}"
key = "{MASTER_KEY}"
engine = "sim"
cache_url = "{cache_url}"
ttl_s = 3600
{gateway}
""")
    return path


def wait_for_tick_after(store, settings, since: float, timeout_s: float = 150.0) -> dict:
    """The first tick of a window starting at or after ``since`` whose plan has finished."""
    deadline = time.monotonic() + timeout_s
    tick: dict = {}
    while time.monotonic() < deadline:
        tick = loop_status(settings, store)["engines"][0]["last_tick"] or {}
        window = tick.get("window")
        started = pd.Timestamp(window).timestamp() if window else 0.0
        if started >= since and tick.get("done"):
            return tick
        time.sleep(0.5)
    raise AssertionError(f"no finished tick after {since}: {tick}")
