"""The simulator's log lines have the shapes of a real vLLM 0.32's (tests/data, captured from a
CPU vLLM serving the same kinds of request): same tags, levels, file info, wording and fields;
only values differ."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from jobs.simulator import SimulatorConfig, SimulatorServer
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration

REAL_LOG = REPO_ROOT / "tests" / "data" / "vllm-0.32-cpu-debug.log"
SYSTEM = "You are the billing desk. Always cite the invoice number. Answer briefly."
_VALUES = [
    (r"pid=\d+", "pid=N"),
    (r"\d\d-\d\d \d\d:\d\d:\d\d", "TS"),
    (r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "STR"),  # Python reprs
    (r"\[[\d, ]*\]", "LIST"),  # token ids, stop lists
    (r"\b(cmpl|chatcmpl)-[0-9a-f]{16}", r"\1-ID"),
    (r"Request [0-9a-f]{16} JSON body: .*", "Request ID JSON body: BODY"),
    (r"-[0-9a-f]{8}\.$", "-SUFFIX."),
    (r"\d+(?:\.\d+)?", "0"),
]
#: the lines compared: each request's life, from its body to the access line and errors
_KINDS = ("JSON body", " details: prompt: ", "Received request", "Added request",
          '"POST /v1/', "Error with model", "create_error_response")  # fmt: skip


def shape(line: str) -> str:
    """``line`` with every value replaced by a placeholder; ``[file:line]`` is kept as is."""
    where = re.search(r"\[[\w./]+:\d+\]", line)
    if where:
        line = line.replace(where.group(), "WHERE", 1)
    for pattern, placeholder in _VALUES:
        line = re.sub(pattern, placeholder, line)
    return line.replace("WHERE", where.group(), 1) if where else line


def request_shapes(lines: list[str]) -> set[str]:
    return {shape(line) for line in lines if any(kind in line for kind in _KINDS)}


def _replay_real_requests(url: str) -> None:
    """The requests the real capture served: streamed completion, chats, a sampled completion,
    an unknown model, a prompt over the context."""
    chat = lambda q, **kw: {  # noqa: E731
        "model": "sim-llm", "max_tokens": 3, **kw,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
    }  # fmt: skip
    prompt = f"{SYSTEM}\n\nQuestion: where is invoice 42?\nAnswer:"
    body = {"model": "sim-llm", "prompt": prompt, "max_tokens": 3, "stream": True}
    httpx.post(f"{url}/v1/completions", json={**body, "stream_options": {"include_usage": True}})
    httpx.post(f"{url}/v1/chat/completions", json=chat("It's late, isn't it?", stream=True))
    sampled = {"model": "sim-llm", "prompt": f"{SYSTEM} Tell me more.", "max_tokens": 2}
    httpx.post(f"{url}/v1/completions", json={**sampled, "temperature": 0.7, "top_p": 0.9})
    httpx.post(f"{url}/v1/chat/completions", json=chat('Ünïcode "quotes" and\ttabs'))
    httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"},
    )
    httpx.post(f"{url}/v1/completions", json={"model": "sim-llm", "prompt": "x " * 4097})


def test_request_lines_have_the_shapes_of_a_real_vllm(tmp_path: Path):
    log_file = tmp_path / "engine.log"
    with SimulatorServer(SimulatorConfig(log_file=log_file, max_model_len=4096)) as sim:
        _replay_real_requests(sim.url)
    ours = request_shapes(log_file.read_text().splitlines())
    real = request_shapes(REAL_LOG.read_text().splitlines())
    assert ours - real == set(), "lines no real vLLM writes"
    assert len(ours) >= len(_KINDS)


def test_uvicorn_lines_are_untagged_and_vllm_lines_tagged(tmp_path: Path):
    log_file = tmp_path / "engine.log"
    with SimulatorServer(SimulatorConfig(log_file=log_file)) as sim:
        httpx.get(f"{sim.url}/v1/models")
    lines = log_file.read_text().splitlines()
    real = REAL_LOG.read_text().splitlines()
    for prefix in ("INFO:     Started server process", "INFO:     127.0.0.1:"):
        assert any(ln.startswith(prefix) for ln in lines) and any(
            ln.startswith(prefix) for ln in real
        )
    assert lines[0].startswith("(APIServer pid=") and "SIMULATOR" in lines[0]
