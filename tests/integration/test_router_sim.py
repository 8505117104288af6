"""Simulator replicas behind the real ``vllm-router``: the routes the router calls on every
replica are served as a current vLLM serves them, and ingest takes none of them for requests."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from jobs.simulator import SimulatorServer
from pipeline.ingest import IngestOptions, ingest_paths
from tests.integration.router import RouterProcess, simulator_replicas

pytestmark = pytest.mark.integration

SYSTEM = "You answer questions about the train timetable of the northern line. " * 4


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[SimulatorServer]]:
    with simulator_replicas(tmp_path, 2) as servers:
        yield servers


def test_render_routes_answer_as_a_current_vllm(replicas):
    url = replicas[0].url
    text = {"prompt": ["one two three", "four five"], "max_tokens": 3, "temperature": 0.0}
    rendered = httpx.post(f"{url}/v1/completions/render", json=text).json()
    counted = httpx.post(f"{url}/tokenize", json={"prompt": "one two three"}).json()
    assert [len(r["token_ids"]) for r in rendered] == [3, 2]
    assert rendered[0]["token_ids"] == counted["tokens"]
    assert rendered[0]["request_id"].startswith("cmpl-") and rendered[0]["model"] == "sim-llm"
    assert rendered[1]["sampling_params"]["max_tokens"] == 3
    chat = {"messages": [{"role": "system", "content": SYSTEM}], "stream": True}
    one = httpx.post(f"{url}/v1/chat/completions/render", json=chat).json()
    tokenized = httpx.post(f"{url}/tokenize", json=chat).json()
    assert one["token_ids"] == tokenized["tokens"] and one["stream"] is True
    missing = httpx.post(f"{url}/v1/chat/completions/render", json={**chat, "model": "nope"})
    assert missing.status_code == 404
    assert replicas[0].engine is not None and replicas[0].engine.cache.usage == 0


def test_requests_routed_by_cache_aware_are_the_only_records(replicas, tmp_path):
    with RouterProcess([r.url for r in replicas], "cache_aware", tmp_path / "router.log") as router:
        for n in range(6):
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"When does train {n} leave?"}]  # fmt: skip
            chat = {"model": "sim-llm", "messages": messages, "max_tokens": 2}
            assert httpx.post(f"{router.url}/v1/chat/completions", json=chat).status_code == 200
            text = {"model": "sim-llm", "prompt": f"{SYSTEM} Platform {n}?", "max_tokens": 2}
            assert httpx.post(f"{router.url}/v1/completions", json=text).status_code == 200
    logs = [r.config.log_file for r in replicas]
    access = "".join(Path(p).read_text() for p in logs if p is not None)
    renders = re.findall(r'"POST (/v1/(?:chat/)?completions/render) HTTP/1.1" (\d+)', access)
    assert len(renders) == 2 * 12  # every request rendered on every replica...
    assert {status for _, status in renders} == {"200"}  # ...and no fallback to /tokenize
    assert '"POST /tokenize' not in access
    result = ingest_paths([p for p in logs if p is not None], IngestOptions(model="sim-llm"))
    assert result.summary_dict()["rejected"] == 0
    assert len(result.records) == 12 and result.records["request_id"].notna().all()
