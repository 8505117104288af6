"""``prewarm simulator`` as a user runs it: the real console script, real HTTP."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _prewarm() -> list[str]:
    script = shutil.which("prewarm") or str(Path(sys.executable).with_name("prewarm"))
    return [script]


def test_prewarm_simulator_serves_and_logs(tmp_path):
    port, log_file = _free_port(), tmp_path / "engine.log"
    cmd = [*_prewarm(), "simulator", "--port", str(port), "--block-size", "8",
           "--capacity-blocks", "64", "--prefill-ms-per-token", "0", "--decode-ms-per-token", "0",
           "--log-file", str(log_file)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "simulator did not start"
            time.sleep(0.2)
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": "a b c d e f g h i j"})
        assert answer.json()["system_fingerprint"] == "prewarm-simulator"
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["owned_by"] == "prewarm-simulator"
    finally:
        proc.terminate()
        output = proc.communicate(timeout=20)[0]
    text = log_file.read_text()
    assert "prewarm engine SIMULATOR" in text and "block_size=8" in text
    assert "Received request cmpl-" in text
    assert "prewarm engine SIMULATOR" in output  # also on stdout
