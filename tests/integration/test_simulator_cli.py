"""``prewarm simulator`` as a user runs it: the real console script, real HTTP."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from jobs.embedded import free_port
from tests.integration.processes import prewarm_script, wait_for_http

pytestmark = pytest.mark.integration


def test_prewarm_simulator_serves_and_logs(tmp_path):
    port, log_file = free_port(), tmp_path / "engine.log"
    cmd = [prewarm_script(), "simulator", "--port", str(port), "--block-size", "8",
           "--capacity-blocks", "64", "--prefill-ms-per-token", "0", "--decode-ms-per-token", "0",
           "--log-file", str(log_file)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_http(f"{url}/health", proc)
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
