"""A router's calls on a replica are not requests: ``vllm-router`` under ``cache_aware`` calls
``/v1/completions/render`` or ``/v1/chat/completions/render`` on every replica for every request
(falling back to ``/tokenize`` on a 404), and probes ``/health``; none of them is a record."""

from __future__ import annotations

from pathlib import Path

from pipeline.ingest import IngestOptions, ingest_paths
from pipeline.ingest.vllm import NOT_A_REQUEST_LINE

TAG = "(APIServer pid=4533) "
ENV = "INFO 12-04 06:02:01 [entrypoints/.../utils/request_logger.py:65] "
# A replica's log behind vllm-router 0.1.17 (cache_aware), as captured from the simulator
# before it served the render routes: every routed request costs a 404 and a /tokenize.
ROUTED = [
    'INFO:     127.0.0.1:53242 - "GET /health HTTP/1.1" 200 OK',
    'INFO:     127.0.0.1:40624 - "POST /v1/chat/completions/render HTTP/1.1" 404 Not Found',
    'INFO:     127.0.0.1:40624 - "POST /tokenize HTTP/1.1" 200 OK',
    f"{TAG}{ENV}Received request chatcmpl-37aebf7d39e95c6c: params: SamplingParams(n=1, "
    "temperature=1.0, top_p=1.0, top_k=0, max_tokens=2), lora_request: None.",
    'INFO:     127.0.0.1:40624 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    'INFO:     127.0.0.1:40624 - "POST /v1/completions/render HTTP/1.1" 404 Not Found',
    'INFO:     127.0.0.1:40628 - "POST /tokenize HTTP/1.1" 500 Internal Server Error',
    'INFO:     127.0.0.1:40628 - "GET /get_server_info HTTP/1.1" 404 Not Found',
    'INFO:     127.0.0.1:40628 - "GET /metrics?x=1 HTTP/1.1" 503 Service Unavailable',
    'INFO:     127.0.0.1:40630 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request',
    'INFO:     127.0.0.1:40630 - "POST /v1/completions HTTP/1.1" 429 Too Many Requests',
]


def _ingest(tmp_path: Path, lines: list[str]):
    path = tmp_path / "vllm-replica.log"
    path.write_text("\n".join(lines) + "\n")
    result = ingest_paths([path], IngestOptions(model="sim-llm", year=2026))
    return result, result.summary[0]


def test_failed_calls_of_routes_that_run_no_request_are_no_records(tmp_path):
    result, summary = _ingest(tmp_path, ROUTED)
    records = result.records
    assert summary.rejects.total == 0
    assert summary.ignored[NOT_A_REQUEST_LINE] == 5  # two renders, tokenize, info, metrics
    assert len(records) == 3  # the chat served, the chat refused, the completion overloaded
    failed = records[records["request_id"].isna()]
    assert sorted(zip(failed["endpoint"], failed["status"], strict=True)) == [
        ("/v1/chat/completions", "rejected"), ("/v1/completions", "overloaded"),
    ]  # fmt: skip


def test_render_calls_alone_leave_no_records(tmp_path):
    lines = [ROUTED[1], ROUTED[5]] * 20  # 40 router calls, as the issue counted beside 15
    result, summary = _ingest(tmp_path, lines)
    assert len(result.records) == 0 and summary.rejects.total == 0
    assert summary.ignored[NOT_A_REQUEST_LINE] == 40
