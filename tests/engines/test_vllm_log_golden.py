"""Golden file: an unedited excerpt of a real vLLM 0.32 CPU log at ``VLLM_LOGGING_LEVEL=DEBUG``.

The excerpt (``tests/data/vllm-0.32-cpu-debug.log``) holds, in order: a streaming completion, a
streaming chat request, a non-streaming completion with sampling parameters, a non-streaming chat
request with non-ASCII text, quotes and a tab, a chat request for an unknown model (404) and a
completion over the context length (400). Each accepted request has three request-logger lines
(``JSON body``, ``details: prompt: … prompt_token_ids: […]`` and ``Received request … params:``)
amid worker and engine-core DEBUG lines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.ingest import ingest_paths

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "vllm-0.32-cpu-debug.log"
SYSTEM = "You are the billing desk. Always cite the invoice number. Answer briefly."


@pytest.fixture(scope="module")
def records():
    result = ingest_paths([GOLDEN])
    return result.records.set_index("request_id", drop=False)


def test_every_accepted_request_becomes_one_record(records):
    ids = [i for i in records["request_id"] if isinstance(i, str)]
    assert ids == [
        "cmpl-bbfb7771cc17e981-0",
        "chatcmpl-aaa98de3a4f7e28f",
        "cmpl-b09117efbb9abcfe-0",
        "chatcmpl-925a1d30ce2122ce",
    ]


def test_prompts_token_counts_and_params_are_read(records):
    completion = records.loc["cmpl-bbfb7771cc17e981-0"]
    assert completion["prompt"] == f"{SYSTEM}\n\nQuestion: where is invoice 42?\nAnswer:"
    assert completion["prompt_tokens"] == 48
    assert completion["max_tokens"] == 3
    assert completion["temperature"] == 0.0
    sampled = records.loc["cmpl-b09117efbb9abcfe-0"]
    assert (sampled["temperature"], sampled["top_p"], sampled["max_tokens"]) == (0.7, 0.9, 2)


def test_chat_prompts_are_the_rendered_template(records):
    chat = records.loc["chatcmpl-aaa98de3a4f7e28f"]
    assert chat["prompt"].startswith(f"<s><|system|>\n{SYSTEM}</s>\n<|user|>\n")
    assert chat["prompt"].endswith("It's late, isn't it?</s>\n<|assistant|>\n")
    assert chat["prompt_tokens"] == 61
    odd = records.loc["chatcmpl-925a1d30ce2122ce"]
    assert 'Ünïcode "quotes" and\ttabs' in odd["prompt"]
    assert odd["prompt_tokens"] == 65


def test_http_errors_are_not_served_requests(records):
    served = records[records["request_id"].notna()]
    assert set(served["endpoint"]) == {"/v1/completions", "/v1/chat/completions"}
    assert not served["status"].isin(["rejected"]).any()
