"""Send workload requests to an OpenAI-compatible engine and measure what a user sees.

Every request streams, with usage in the last chunk: time to first token is the time to the first
chunk that carries a choice, and ``usage.prompt_tokens_details.cached_tokens`` says how many prompt
tokens the engine's prefix cache served (exact, free of timing noise).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx

from benchmarks.engines.workload import Request, Template

PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}


@dataclass(frozen=True)
class Served:
    """What one request got: time to first token, prompt tokens and cached prompt tokens."""

    template: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int

    @property
    def hit(self) -> bool:
        return self.cached_tokens > 0


def stream(client: httpx.Client, path: str, body: dict) -> tuple[float, dict]:
    """POST ``body`` streaming; return (seconds to first choice chunk, final usage)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    started = time.monotonic()
    first: float | None = None
    usage: dict = {}
    with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"{path} answered {response.status_code}: {response.text[:300]}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and first is None:
                first = time.monotonic() - started
            usage = chunk.get("usage") or usage
    if first is None:
        raise RuntimeError(f"{path} streamed no choice")
    return first, usage


def send(
    client: httpx.Client,
    request: Request,
    templates: list[Template],
    model: str,
    max_tokens: int = 4,
) -> Served:
    """Send one workload request and report what it got."""
    ttft, usage = stream(
        client, PATHS[request.endpoint], request.body(templates, model, max_tokens)
    )
    details = usage.get("prompt_tokens_details") or {}
    return Served(
        template=request.template,
        ttft_s=ttft,
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        cached_tokens=int(details.get("cached_tokens") or 0),
    )


def prime_template(client: httpx.Client, template: Template, model: str) -> Served:
    """Hand-made priming: one ``max_tokens=1`` request holding only the template head.

    Chat templates are primed through the chat endpoint with the system message alone, so the
    engine's chat template renders the same token prefix real requests start with.
    """
    if template.endpoint == "chat":
        path = PATHS["chat"]
        body: dict = {"messages": [{"role": "system", "content": template.text}]}
    else:
        path, body = PATHS["completion"], {"prompt": template.text}
    body.update(model=model, max_tokens=1, temperature=0.0)
    ttft, usage = stream(client, path, body)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Served(template.index, ttft, int(usage.get("prompt_tokens", 0)), int(cached))


def replay(
    url: str, requests: list[Request], templates: list[Template], model: str, max_tokens: int = 4
) -> list[Served]:
    """Send ``requests`` one after another, as the traffic after a restart."""
    with httpx.Client(base_url=url, timeout=300.0) as client:
        return [send(client, r, templates, model, max_tokens) for r in requests]
