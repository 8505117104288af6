"""The engine simulator over real HTTP on loopback."""

from __future__ import annotations

import ast
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from jobs.simulator import FaultInjection, LatencyModel, SimulatorConfig, SimulatorServer

pytestmark = pytest.mark.integration

SYSTEM = "You are a careful assistant for the billing team. Answer in one short paragraph. " * 8


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimulatorServer]:
    config = SimulatorConfig(log_file=tmp_path / "vllm.log", capacity_blocks=512)
    with SimulatorServer(config) as server:
        yield server


def _chat(url: str, question: str, **extra) -> httpx.Response:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return httpx.post(
        f"{url}/v1/chat/completions", json={"messages": messages, **extra}, timeout=30
    )


def _sse_events(text: str) -> list[dict | str]:
    events = [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def test_a_shared_system_prompt_is_served_from_cache_the_second_time(sim):
    first = _chat(sim.url, "Where is my refund?", max_tokens=4).json()
    second = _chat(sim.url, "Why was I charged twice this month?", max_tokens=4).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and cached % sim.config.block_size == 0
    assert cached < second["usage"]["prompt_tokens"]


def test_an_identical_prompt_recomputes_at_least_its_last_token(sim):
    body = {"prompt": "one two three four " * 8, "max_tokens": 2}  # 32 tokens = 2 whole blocks
    httpx.post(f"{sim.url}/v1/completions", json=body)
    again = httpx.post(f"{sim.url}/v1/completions", json=body).json()
    assert again["usage"]["prompt_tokens"] == 32
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 16


def test_a_primed_prefix_is_cached_to_its_last_whole_block(sim):
    prefix = "one two three four " * 8  # exactly 2 blocks, as a warm-up request sends it
    httpx.post(f"{sim.url}/v1/completions", json={"prompt": prefix, "max_tokens": 1})
    full = httpx.post(f"{sim.url}/v1/completions", json={"prompt": prefix + "and a question?"})
    assert full.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 32


def test_outputs_and_logprobs_are_deterministic(sim):
    body = {"prompt": "Summarise the invoice.", "max_tokens": 6, "logprobs": 2}
    one = httpx.post(f"{sim.url}/v1/completions", json=body).json()["choices"][0]
    two = httpx.post(f"{sim.url}/v1/completions", json=body).json()["choices"][0]
    assert one["text"] == two["text"] and one["logprobs"] == two["logprobs"]
    assert len(one["logprobs"]["token_logprobs"]) == 6 and one["finish_reason"] == "length"


def test_chat_streaming_sends_role_content_usage_and_done(sim):
    response = _chat(
        sim.url, "Hello?", stream=True, max_tokens=5, logprobs=True, top_logprobs=1,
        stream_options={"include_usage": True},
    )  # fmt: skip
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _sse_events(response.text)
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    content = [e["choices"][0] for e in events[1:-2]]
    assert len(content) == 5 and content[-1]["finish_reason"] == "length"
    assert all(c["logprobs"]["content"][0]["logprob"] < 0 for c in content)
    assert events[-2]["usage"]["completion_tokens"] == 5


def test_streamed_and_plain_completions_agree(sim):
    body = {"prompt": "List three colours.", "max_tokens": 7}
    plain = httpx.post(f"{sim.url}/v1/completions", json=body).json()["choices"][0]["text"]
    streamed = httpx.post(f"{sim.url}/v1/completions", json={**body, "stream": True})
    chunks = [e for e in _sse_events(streamed.text) if e != "[DONE]"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain


def test_uncached_prefill_is_slower_than_cached(tmp_path):
    latency = LatencyModel(prefill_ms_per_token=2.0, decode_ms_per_token=0.0)
    prompt = "alpha beta gamma delta " * 100  # 400 pseudo-tokens: 0.8 s of simulated prefill
    with SimulatorServer(SimulatorConfig(latency=latency)) as server:
        timings = []
        for _ in range(2):
            started = time.perf_counter()
            httpx.post(f"{server.url}/v1/completions", json={"prompt": prompt, "max_tokens": 1})
            timings.append(time.perf_counter() - started)
    assert timings[0] >= 0.8  # the simulator really sleeps for the uncached tokens
    assert timings[1] < timings[0] / 2


def test_metrics_use_vllm_names_and_count_cached_tokens(sim):
    usages = [_chat(sim.url, q, max_tokens=3).json()["usage"] for q in ("a?", "b?", "c?")]
    text = httpx.get(f"{sim.url}/metrics").text
    assert _metric(text, "vllm:prefix_cache_queries_total") == sum(
        u["prompt_tokens"] for u in usages
    )
    hits = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert _metric(text, "vllm:prefix_cache_hits_total") == hits > 0
    assert _metric(text, "vllm:generation_tokens_total") == 9
    assert _metric(text, "vllm:time_to_first_token_seconds_count") == 3
    assert _metric(text, "vllm:num_requests_running") == 0
    assert _metric(text, "process_start_time_seconds") > 0
    assert _metric(text, "prewarm_simulator_info") == 1
    assert "vllm:num_requests_waiting" in text and "vllm:prompt_tokens_total" in text


def test_lora_adapters_load_serve_and_unload_with_vllm_shapes(sim):
    load = f"{sim.url}/v1/load_lora_adapter"
    ok = httpx.post(load, json={"lora_name": "sql", "lora_path": "org/sql-lora"})
    assert ok.status_code == 200 and ok.text == "Success: LoRA adapter 'sql' added successfully."
    again = httpx.post(load, json={"lora_name": "sql", "lora_path": "org/sql-lora"})
    assert again.status_code == 400
    assert again.json()["error"]["message"] == "The lora adapter 'sql' has already been loaded."
    assert httpx.post(load, json={"lora_name": "x"}).status_code == 400
    missing = httpx.post(load, json={"lora_name": "y", "lora_path": "/no/such/adapter"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    models = [m["id"] for m in httpx.get(f"{sim.url}/v1/models").json()["data"]]
    assert models == ["sim-llm", "sql"]
    served = httpx.post(f"{sim.url}/v1/completions", json={"model": "sql", "prompt": "select"})
    assert served.status_code == 200
    gone = httpx.post(f"{sim.url}/v1/unload_lora_adapter", json={"lora_name": "sql"})
    assert gone.text == "Success: LoRA adapter 'sql' removed successfully."
    after = httpx.post(f"{sim.url}/v1/unload_lora_adapter", json={"lora_name": "sql"})
    assert after.status_code == 404


def test_adapters_do_not_share_the_base_models_cache(sim):
    httpx.post(f"{sim.url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "a"})
    body = {"prompt": "shared words here " * 20, "max_tokens": 1}
    httpx.post(f"{sim.url}/v1/completions", json=body)
    on_adapter = httpx.post(f"{sim.url}/v1/completions", json={**body, "model": "a"}).json()
    assert on_adapter["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_unknown_model_and_bad_bodies_get_vllm_errors(sim):
    unknown = httpx.post(f"{sim.url}/v1/completions", json={"model": "gpt-4", "prompt": "x"})
    assert unknown.status_code == 404
    error = unknown.json()["error"]
    assert error["message"] == "The model `gpt-4` does not exist. Valid aliases: sim-llm."
    assert error["param"] == "model"
    bad = httpx.post(f"{sim.url}/v1/completions", content=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"
    no_prompt = httpx.post(f"{sim.url}/v1/completions", json={"max_tokens": 3})
    assert no_prompt.status_code == 400


def test_a_small_cache_evicts_old_prefixes(tmp_path):
    with SimulatorServer(SimulatorConfig(capacity_blocks=4, block_size=4)) as server:
        post = lambda p: httpx.post(  # noqa: E731
            f"{server.url}/v1/completions", json={"prompt": p, "max_tokens": 1}
        ).json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        first = "red green blue cyan magenta yellow black white grey brown pink gold a"
        post(first)
        post("one two three four five six seven eight nine ten eleven twelve b")
        assert post(first) == 0  # pushed out by the second prompt's blocks
        assert server.engine is not None and server.engine.cache.evictions > 0


def test_fault_injection_fails_or_delays_requests(tmp_path):
    config = SimulatorConfig(faults=FaultInjection(error_rate=1.0))
    with SimulatorServer(config) as server:
        failed = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x"})
        assert failed.status_code == 500 and "simulat" in failed.json()["error"]["message"]
        config.faults.error_rate, config.faults.delay_s = 0.0, 2.0
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/completions", json={"prompt": "x"}, timeout=0.3)


def test_restart_comes_back_cold_with_a_new_start_time(sim):
    body = {"prompt": "warm me up please " * 10, "max_tokens": 1}
    httpx.post(f"{sim.url}/v1/completions", json=body)
    started = _metric(httpx.get(f"{sim.url}/metrics").text, "process_start_time_seconds")
    url = sim.url
    sim.restart()
    assert sim.url == url
    again = httpx.post(f"{sim.url}/v1/completions", json=body).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert _metric(httpx.get(f"{sim.url}/metrics").text, "process_start_time_seconds") > started


def test_logs_are_current_vllm_format_and_say_simulator(sim):
    prompt = "It's a test prompt with 'quotes' and a\nnewline."
    httpx.post(f"{sim.url}/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    assert sim.engine is not None
    sim.engine.log_stats()
    lines = Path(sim.config.log_file).read_text().splitlines()  # type: ignore[arg-type]
    # vLLM's own lines carry the process tag; uvicorn's (own formatter) do not.
    assert all(line.startswith(("(APIServer pid=", "INFO:     ")) for line in lines)
    assert "prewarm engine SIMULATOR" in lines[0]
    details = next(line for line in lines if " details: prompt: " in line)
    assert re.match(
        r"\(APIServer pid=\d+\) DEBUG \d\d-\d\d \d\d:\d\d:\d\d \[[\w/.]+:\d+\] ", details
    )
    shown = details.split(" details: prompt: ", 1)[1].split(", prompt_token_ids: ")[0]
    assert ast.literal_eval(shown) == prompt
    assert any(
        re.search(r"Received request cmpl-[0-9a-f]{16}-0: params: SamplingParams\(", ln)
        for ln in lines
    )
    assert any(re.search(r"Added request cmpl-[0-9a-f]{16}-0-[0-9a-f]{8}\.$", ln) for ln in lines)
    assert any('- "POST /v1/completions HTTP/1.1" 200 OK' in ln for ln in lines)
    assert any(
        "Engine 000: Avg prompt throughput:" in ln and "Prefix cache hit rate:" in ln
        for ln in lines
    )


def test_embeddings_are_deterministic_unit_vectors_closer_for_shared_words(sim):
    texts = ["refund for my invoice", "refund my invoice please", "train to Munich"]
    body = httpx.post(f"{sim.url}/v1/embeddings", json={"input": texts}).json()
    vectors = [row["embedding"] for row in body["data"]]
    again = httpx.post(f"{sim.url}/v1/embeddings", json={"input": texts[0]}).json()
    assert again["data"][0]["embedding"] == vectors[0]
    dot = lambda a, b: sum(x * y for x, y in zip(a, b, strict=True))  # noqa: E731
    assert abs(dot(vectors[0], vectors[0]) - 1.0) < 1e-4
    assert dot(vectors[0], vectors[1]) > dot(vectors[0], vectors[2])
    assert body["usage"]["prompt_tokens"] > 0


def test_cache_salt_keeps_tenants_apart_like_vllm(sim):
    body = {"prompt": "tenant shared system prompt words " * 10, "max_tokens": 1}
    post = lambda extra: httpx.post(f"{sim.url}/v1/completions", json={**body, **extra}).json()  # noqa: E731
    post({"cache_salt": "tenant-a"})
    other = post({"cache_salt": "tenant-b"})["usage"]["prompt_tokens_details"]["cached_tokens"]
    same = post({"cache_salt": "tenant-a"})["usage"]["prompt_tokens_details"]["cached_tokens"]
    unsalted = post({})["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert other == 0 and unsalted == 0 and same > 0


def test_tokenize_counts_what_the_cache_blocks_are_made_of(sim):
    system = {"role": "system", "content": SYSTEM}
    chat = {"messages": [system], "add_generation_prompt": False}
    counted = httpx.post(f"{sim.url}/tokenize", json=chat).json()
    served = _chat(sim.url, "Anything?", max_tokens=1).json()["usage"]["prompt_tokens"]
    assert 0 < counted["count"] < served and len(counted["tokens"]) == counted["count"]
    text = httpx.post(f"{sim.url}/tokenize", json={"prompt": "one two three"}).json()
    assert text["count"] == 3 and text["max_model_len"] == sim.config.max_model_len
