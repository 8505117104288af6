"""The real ``vllm-router`` and ``sglang-router`` (PyPI, Rust binaries in their wheels) as
processes for tests.

A missing binary skips the test on a laptop and fails it in CI, as a missing Redis does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from jobs.embedded import free_port
from jobs.simulator import SimulatorConfig, SimulatorServer
from pipeline.router_kinds import router_kind


@contextmanager
def simulator_replicas(folder: Path, count: int) -> Iterator[list[SimulatorServer]]:
    """``count`` simulator replicas, each logging to ``folder/replica<i>.log``; stopped after."""
    servers = [
        SimulatorServer(SimulatorConfig(log_file=folder / f"replica{i}.log")).start()
        for i in range(count)
    ]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


#: the version of each router kind the tests run (pinned in pyproject's dev extra)
ROUTER_VERSIONS = {"vllm-router": "0.1.17", "sglang-router": "0.3.2"}


def router_binary(kind: str = "vllm-router") -> str:
    """The console script of router ``kind`` in this environment (skips, or fails in CI)."""
    found = shutil.which(kind) or str(Path(sys.executable).with_name(kind))
    if not Path(found).exists():
        install = f"pip install '{kind}=={ROUTER_VERSIONS[kind]}'"
        if os.environ.get("CI"):
            pytest.fail(f"{kind} is required in CI ({install})")
        pytest.skip(f"{kind} is not installed ({install})")
    return found


class RouterProcess:
    """A router (``kind``: ``vllm-router`` or ``sglang-router``) on loopback in front of
    ``workers`` with ``policy``; ``restart()`` comes back on the same port with an empty
    memory, as a redeployed router does."""

    def __init__(
        self, workers: Sequence[str], policy: str, log_path: Path, *extra: str,
        kind: str = "vllm-router",
    ) -> None:  # fmt: skip
        self.workers, self.policy, self.log_path, self.extra = (
            list(workers),
            policy,
            log_path,
            extra,
        )
        self.kind = kind
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The router's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> RouterProcess:
        """Start and wait until the router lists its workers and answers ``/health``."""
        launch = ["launch"] if self.kind == "sglang-router" else []
        level = "warn" if self.kind == "sglang-router" else "warning"
        args = [router_binary(self.kind), *launch, "--host", "127.0.0.1", "--port", str(self.port),
                "--worker-urls", *self.workers, "--policy", self.policy,
                "--health-check-interval-secs", "1", "--log-level", level, *self.extra]  # fmt: skip
        if "--prometheus-port" not in self.extra:
            args += ["--prometheus-port", str(free_port())]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            assert self.proc.poll() is None, f"{self.kind} exited: {self.log_path.read_text()}"
            assert time.monotonic() < deadline, f"{self.kind} not ready in {timeout_s}s"
            time.sleep(0.2)
        return self

    def _ready(self) -> bool:
        """``/health`` answers 200 and the worker list holds every worker it was started with
        (sglang-router answers ``/health`` before it has registered them all: a look in
        between found one replica of three)."""
        kind = router_kind(self.kind)
        try:
            if httpx.get(f"{self.url}/health", timeout=1).status_code != 200:
                return False
            listed = httpx.get(f"{self.url}{kind.workers_path}", timeout=1)
        except httpx.TransportError:
            return False
        if listed.status_code != 200:
            return False
        wanted = {w.rstrip("/") for w in self.workers}
        return wanted <= set(kind.workers(listed.json(), self.url))

    def stop(self) -> None:
        """Terminate the router (the process this object started, by its id)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> RouterProcess:
        """Stop and start again on the same port (its routing memory starts empty)."""
        self.stop()
        return self.start()

    def __enter__(self) -> RouterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
