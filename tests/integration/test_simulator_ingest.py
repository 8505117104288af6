"""prewarm reads its own simulator's logs: the simulator's vLLM-format lines become records."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from jobs.simulator import SimulatorConfig, SimulatorServer, render_chat
from pipeline.ingest import IngestOptions, ingest_paths
from pipeline.prefix_blocks import block_hashes

pytestmark = pytest.mark.integration

SYSTEM = "You are the assistant of a library. Be brief. " * 6
QUESTIONS = ["Opening hours?", "Can I renew a loan online?", "Where is the map room?"]


def _serve(tmp_path: Path) -> tuple[Path, list[str]]:
    log_file = tmp_path / "engine.log"
    prompts = []
    with SimulatorServer(SimulatorConfig(log_file=log_file)) as sim:
        for question in QUESTIONS:
            messages = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question},
            ]
            httpx.post(
                f"{sim.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 2}
            )
            prompts.append(render_chat(messages))
        text = "Translate to French: the cache is warm."
        httpx.post(f"{sim.url}/v1/completions", json={"prompt": text, "temperature": 0.0})
        prompts.append(text)
        assert sim.engine is not None
        sim.engine.log_stats()
    return log_file, prompts


def test_every_prompt_and_its_block_chain_are_read_back(tmp_path):
    log_file, prompts = _serve(tmp_path)
    result = ingest_paths([log_file], IngestOptions(model="sim-llm"))
    assert result.summary_dict()["rejected"] == 0
    with_prompt = result.records[result.records["prompt"].notna()]
    assert sorted(with_prompt["prompt"]) == sorted(prompts)
    for _, row in with_prompt.iterrows():
        assert list(row["prefix_hashes"]) == block_hashes(row["prompt"])
    greedy = result.records[result.records["temperature"] == 0.0]
    assert len(greedy) == 1 and greedy["max_tokens"].iloc[0] == 16
    assert result.metrics["prefix_cache_hit_rate"].iloc[-1] > 0


def test_each_request_is_one_record(tmp_path):
    # vLLM logs the DEBUG details line before the Received line (RequestLogger.log_inputs).
    log_file, prompts = _serve(tmp_path)
    records = ingest_paths([log_file], IngestOptions(model="sim-llm")).records
    assert len(records) == len(prompts)
    assert records["prompt"].notna().all() and records["prompt_tokens"].notna().all()
