"""prewarm's own requests in an engine's log are left out of what the loop observes: every
request it sends carries its own id, vLLM names it in the log, the sources drop it; and a vLLM
``/tokenize`` call (logged like a request at DEBUG) is no served request at all."""

from __future__ import annotations

import json

import httpx
import pandas as pd
import pytest

from pipeline.ingest import IngestOptions, ingest_paths
from pipeline.own_requests import is_own_request, own_request_id, without_own_requests
from pipeline.planner.plan import WarmItem
from pipeline.windows import item_window_counts
from tasks.adapters.engine_client import EngineClient, RetryPolicy
from tasks.settings import EngineSettings

HEX = "0123456789abcdef" * 2
PARAMS = (
    "SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, "
    "temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=[], max_tokens=1, "
    "min_tokens=0, logprobs=None), lora_request: None."
)


def _vllm_request(request_id: str, prompt: str, params: str = PARAMS) -> list[str]:
    """The two request-logger lines vLLM 0.32 prints at DEBUG for one request."""
    head = "(APIServer pid=7) {} 12-01 12:23:04 [entrypoints/.../utils/request_logger.py:{}] "
    return [
        head.format("DEBUG", 55) + f"Request {request_id} details: prompt: {prompt!r}, "
        "prompt_token_ids: [0, 31, 95, 5571], prompt_embeds shape: None.",
        head.format("INFO", 65) + f"Received request {request_id}: params: {params}",
    ]


@pytest.mark.parametrize(
    ("request_id", "own"),
    [
        (f"cmpl-prewarm-{HEX}-0", True),  # vLLM completions: cmpl-<X-Request-Id>-<n>
        (f"chatcmpl-prewarm-{HEX}", True),
        (f"tokenize-prewarm-{HEX}", True),
        ("cmpl-9aac8f57cd434627-0", False),
        (f"cmpl-notprewarm-{HEX}-0", False),
        (f"cmpl-prewarm-{HEX[:31]}-0", False),
        (None, False),
    ],
)
def test_own_request_ids_are_recognised_in_the_ids_engines_build(request_id, own):
    assert is_own_request(request_id) is own


def test_leaving_own_requests_out_subtracts_their_counts_exactly():
    ts = pd.Timestamp("2026-12-01T12:00:00Z")
    rows = [
        {"ts": ts + pd.Timedelta(seconds=s), "request_id": rid, "prompt": prompt,
         "prompt_tokens": 40, "output_tokens": 1}
        for s, rid, prompt in [
            (1, "cmpl-a-0", "You are the billing desk. " * 8 + "Question 1"),
            (2, f"cmpl-prewarm-{HEX}-0", "You are the billing desk. " * 8),
            (3, "cmpl-b-0", "You are the billing desk. " * 8 + "Question 2"),
            (40, f"cmpl-prewarm-{'f' * 32}-0", "Something only prewarm sent. " * 4),
        ]
    ]  # fmt: skip
    from pipeline.records import conform_records

    records = conform_records(pd.DataFrame(rows))
    counts = item_window_counts(records, "30s")
    kept, left, dropped = without_own_requests(records, counts, "30s")
    expected = item_window_counts(records[~records["request_id"].str.contains("prewarm")], "30s")
    assert dropped == 2 and list(kept["request_id"]) == ["cmpl-a-0", "cmpl-b-0"]
    order = ["item_kind", "item_key", "window_start"]
    assert left is not None
    pd.testing.assert_frame_equal(
        left.sort_values(order).reset_index(drop=True),
        expected.sort_values(order).reset_index(drop=True),
    )
    assert without_own_requests(kept, expected, "30s")[2] == 0


def test_every_engine_request_carries_a_fresh_id_of_prewarm_own():
    seen: list[str] = []

    def engine(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["x-request-id"])
        return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": {}})

    settings = EngineSettings(name="e", url="http://engine.test", model="m")
    client = EngineClient(settings, retry=RetryPolicy(), transport=httpx.MockTransport(engine))
    item = WarmItem("prefix", "k", "m", text="hello")
    client.complete(item)
    client.complete_many([item, item])
    client.post("/tokenize", {"model": "m", "prompt": "hello"})
    assert len(set(seen)) == 3 and all(is_own_request(f"cmpl-{rid}-0") for rid in seen)
    assert own_request_id(HEX) == f"prewarm-{HEX}"


def test_vllm_tokenize_calls_are_not_served_requests(tmp_path):
    log = tmp_path / "vllm.log"
    lines = [
        *_vllm_request("tokenize-8de5f031737d3d72", "<s><|system|>\nYou are the desk.", "None, "
                       "lora_request: None."),
        *_vllm_request("cmpl-9aac8f57cd434627-0", "You are the desk. Where is invoice 42?"),
    ]  # fmt: skip
    log.write_text("\n".join(lines) + "\n")
    result = ingest_paths([log], IngestOptions(format="vllm", year=2026))
    assert list(result.records["request_id"]) == ["cmpl-9aac8f57cd434627-0"]
    summary = json.dumps(result.summary_dict(), default=str)
    assert "tokenizer request line" in summary
