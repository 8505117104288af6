"""A user's streamed chat request, timed: seconds to the first token and the usage the engine
reported (what the demo replays to measure time to first token)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

#: A client on one engine's base URL.
ChatClient = httpx.Client


def chat_client(url: str, timeout_s: float = 60.0) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=timeout_s)


def timed_chat(client: httpx.Client, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """POST a streamed chat completion; (seconds to its first data line, its usage)."""
    started, ttft, usage = time.perf_counter(), None, dict[str, Any]()
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            if ttft is None:
                ttft = time.perf_counter() - started
            usage = json.loads(line[len("data: ") :]).get("usage") or usage
    return ttft or 0.0, usage
