"""Helpers for tests that run prewarm's own commands as processes."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prewarm_script() -> str:
    """The installed ``prewarm`` console script."""
    return shutil.which("prewarm") or str(Path(sys.executable).with_name("prewarm"))


def wait_for_http(url: str, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """Block until ``url`` answers (any status); fail if ``proc`` dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            assert proc.poll() is None, f"process exited with {proc.returncode}"
            assert time.monotonic() < deadline, f"{url} did not answer in {timeout_s}s"
            time.sleep(0.2)
