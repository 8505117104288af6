"""Logs written by the engine simulator (current vLLM format, DEBUG request logging) parse
with zero rejects, and the records say what was sent."""

from __future__ import annotations

import httpx
import pytest

from jobs.simulator import SimulatorConfig, SimulatorServer
from pipeline.ingest import IngestOptions, ingest_paths

pytestmark = pytest.mark.integration

SYSTEM = "You are the billing assistant. Answer in one short paragraph, politely. " * 4


def test_simulator_logs_parse_with_zero_rejects(tmp_path):
    log = tmp_path / "vllm.log"
    prompt = "It's a test prompt with 'quotes' and a\nnewline, then more words " * 3
    with SimulatorServer(SimulatorConfig(log_file=log, capacity_blocks=512)) as sim:
        for question in ("Where is my refund?", "Why was I charged twice?"):
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question},
            ]
            body = {"messages": messages, "max_tokens": 3, "temperature": 0.5}
            httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=30).raise_for_status()
        completion = {"prompt": prompt, "max_tokens": 2, "seed": 7}
        httpx.post(f"{sim.url}/v1/completions", json=completion, timeout=30).raise_for_status()
        bad = {"model": "no-such-model", "prompt": "x", "max_tokens": 1}
        assert httpx.post(f"{sim.url}/v1/completions", json=bad, timeout=30).status_code >= 400
        assert sim.engine is not None
        sim.engine.log_stats()
    result = ingest_paths([log], IngestOptions())
    summary = result.summary[0]
    assert summary.format == "vllm"
    assert summary.rejects.total == 0, summary.rejects.sample_lines()
    explained = {"uvicorn line", "other vLLM line", "access line (joined by id only)", "error line"}
    assert set(summary.ignored) <= explained
    records = result.records.dropna(subset=["request_id"])
    assert len(records) == 3
    chats = records[records["endpoint"] == "/v1/chat/completions"]
    assert len(chats) == 2 and (chats["temperature"] == 0.5).all()
    assert all(SYSTEM.strip() in p for p in chats["prompt"])
    shared = [set(h) for h in chats["prefix_hashes"]]
    assert len(shared[0] & shared[1]) >= 4  # the system prompt's blocks are common
    done = records[records["endpoint"] == "/v1/completions"].iloc[0]
    assert done["prompt"] == prompt and done["seed"] == 7 and done["max_tokens"] == 2
    assert done["prompt_tokens"] > 0  # the simulator logs token ids for completions
    assert len(result.metrics) >= 1
    failed = result.records[result.records["request_id"].isna()]  # the uvicorn 4xx line
    assert failed["status"].tolist() == ["rejected"]
