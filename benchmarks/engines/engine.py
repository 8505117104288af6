"""Start and stop a real vLLM CPU server (see ``../shared/ENGINES.md``), its stdout in a log file.

The server runs in its own process group (it forks an engine-core and a worker process), so
stopping it stops exactly the processes this module started, and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

VLLM_PYTHON_ENV = "PREWARM_VLLM_PYTHON"
VLLM_MODEL_ENV = "PREWARM_VLLM_MODEL"
DEFAULT_VLLM_PYTHON = Path("/work/vllm-venv/bin/python")
DEFAULT_VLLM_MODEL = Path("/work/engine-model")
SERVED_NAME = "tiny-llama"
#: The CPU backend's KV block size; only whole blocks are reused by the prefix cache.
CPU_BLOCK_TOKENS = 128


def vllm_python() -> Path:
    """The interpreter of the vLLM venv (``PREWARM_VLLM_PYTHON``)."""
    return Path(os.environ.get(VLLM_PYTHON_ENV, DEFAULT_VLLM_PYTHON))


def vllm_model() -> Path:
    """The locally built model directory (``PREWARM_VLLM_MODEL``)."""
    return Path(os.environ.get(VLLM_MODEL_ENV, DEFAULT_VLLM_MODEL))


def missing_prerequisites() -> str | None:
    """Why a real vLLM cannot be started here, or ``None`` when it can."""
    python, model = vllm_python(), vllm_model()
    if not python.exists():
        return f"no vLLM interpreter at {python} (set {VLLM_PYTHON_ENV})"
    if not (model / "config.json").exists():
        return (
            f"no model at {model} (build it: benchmarks/engines/build_model.py; {VLLM_MODEL_ENV})"
        )
    return None


def wait_until_answers(
    url: str, proc: subprocess.Popen[bytes], deadline: float, every_s: float
) -> str | None:
    """Poll ``GET url`` until it answers 200 (``None``); else why not: ``proc`` exited, or
    ``deadline`` (monotonic) passed."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited with {proc.returncode}"
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2.0).status_code == 200:
                return None
        time.sleep(every_s)
    return "not ready in time"


@dataclass
class VllmServer:
    """One vLLM OpenAI-compatible server process writing its stdout/stderr to ``log_path``."""

    port: int
    log_path: Path
    gpu_blocks: int | None = None  # --num-gpu-blocks-override: caps the prefix cache
    enforce_eager: bool = True  # 47 s to ready instead of 60-85 s; same for every arm
    dev_mode: bool = False  # VLLM_SERVER_DEV_MODE: offers POST /reset_prefix_cache
    proc: subprocess.Popen | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(vllm_model()), "--served-model-name", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32",
            "--max-model-len", "4096", "--enable-prefix-caching", "--enable-log-requests",
            "--enable-prompt-tokens-details",
        ]  # fmt: skip
        if self.gpu_blocks is not None:
            cmd += ["--num-gpu-blocks-override", str(self.gpu_blocks)]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        return cmd

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            HF_HUB_OFFLINE="1",
            VLLM_CPU_KVCACHE_SPACE="2",
            VLLM_CPU_NUM_OF_RESERVED_CPU="0",
            # DEBUG puts the prompt, its token ids and the request body in the log.
            VLLM_LOGGING_LEVEL="DEBUG",
            NO_COLOR="1",
        )
        if self.dev_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return env

    def start(self, timeout: float = 300.0) -> float:
        """Start the server and wait until ``/v1/models`` answers; return seconds to ready."""
        started = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                env=self.environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._wait_ready(started + timeout)
        return time.monotonic() - started

    def _wait_ready(self, deadline: float) -> None:
        assert self.proc is not None
        why = wait_until_answers(f"{self.url}/v1/models", self.proc, deadline, every_s=1.0)
        if why is None:
            return
        if self.proc.poll() is None:
            self.stop()
        raise RuntimeError(f"vLLM {why}; see {self.log_path}")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server: SIGTERM to the API server, then SIGKILL to its group after ``timeout``.

        The API server shuts its engine-core process down itself; signalling the whole group at
        once kills the engine core first and fills the log with EngineDeadError tracebacks.
        """
        if self.proc is None or self.proc.poll() is not None:
            self._kill_group(signal.SIGKILL)  # stray children of a dead leader
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill_group(signal.SIGKILL)
            self.proc.wait()
        time.sleep(1.0)
        self._kill_group(signal.SIGKILL)

    def _kill_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
