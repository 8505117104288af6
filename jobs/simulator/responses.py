"""Response bodies and SSE chunks in the shapes vLLM's OpenAI server sends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from jobs.simulator import protocol as proto
from jobs.simulator.engine import Generation
from jobs.simulator.outputs import SimulatedToken


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event (``data: …``)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def completion_body(
    rid: str,
    model: str,
    gens: list[Generation],
    outputs: list[list[SimulatedToken]],
    top: int | None,
) -> dict[str, Any]:
    """A non-streaming ``text_completion`` body, one choice per prompt."""
    choices = [
        {
            "index": i,
            "text": "".join(t.text for t in tokens),
            "logprobs": proto.completion_logprobs(tokens) if top is not None else None,
            "finish_reason": gen.finish_reason,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        for i, (gen, tokens) in enumerate(zip(gens, outputs, strict=True))
    ]
    body = proto.envelope(rid, "text_completion", model, choices)
    usages = [proto.usage(g, len(t)) for g, t in zip(gens, outputs, strict=True)]
    body["usage"] = _sum_usage(usages)
    return body


def _sum_usage(usages: list[dict[str, Any]]) -> dict[str, Any]:
    total = {
        k: sum(u[k] for u in usages) for k in ("prompt_tokens", "total_tokens", "completion_tokens")
    }
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    return {**total, "prompt_tokens_details": {"cached_tokens": cached}}


def chat_body(
    rid: str, model: str, gen: Generation, tokens: list[SimulatedToken], top: int | None
) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` body."""
    message = {"role": "assistant", "content": "".join(t.text for t in tokens), "tool_calls": []}
    choice = {
        "index": 0,
        "message": message,
        "logprobs": proto.chat_logprobs(tokens) if top is not None else None,
        "finish_reason": gen.finish_reason,
        "stop_reason": None,
    }
    body = proto.envelope(rid, "chat.completion", model, [choice])
    body["usage"] = proto.usage(gen, len(tokens))
    return body


async def completion_chunks(
    gen: Generation, rid: str, model: str, include_usage: bool
) -> AsyncIterator[bytes]:
    """Prefill, then one ``text_completion`` chunk per token, usage (if asked) and ``[DONE]``."""
    await gen.prefill()
    top, offset, count = gen.request.params.logprobs, 0, 0
    async for token in gen.stream():
        count += 1
        last = count == len(gen.tokens)
        choice = {
            "index": 0,
            "text": token.text,
            "logprobs": proto.completion_logprobs([token], offset) if top is not None else None,
            "finish_reason": gen.finish_reason if last else None,
            "stop_reason": None,
        }
        offset += len(token.text)
        yield sse(proto.envelope(rid, "text_completion", model, [choice]))
    async for tail in _stream_tail(gen, rid, "text_completion", model, include_usage, count):
        yield tail


async def chat_chunks(
    gen: Generation, rid: str, model: str, include_usage: bool
) -> AsyncIterator[bytes]:
    """Prefill, then a role chunk, one content chunk per token, usage (if asked), ``[DONE]``."""
    await gen.prefill()
    kind, top, count = "chat.completion.chunk", gen.request.params.logprobs, 0
    first = {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    yield sse(proto.envelope(rid, kind, model, [first]))
    async for token in gen.stream():
        count += 1
        last = count == len(gen.tokens)
        choice = {
            "index": 0,
            "delta": {"content": token.text},
            "logprobs": proto.chat_logprobs([token]) if top is not None else None,
            "finish_reason": gen.finish_reason if last else None,
        }
        yield sse(proto.envelope(rid, kind, model, [choice]))
    async for tail in _stream_tail(gen, rid, kind, model, include_usage, count):
        yield tail


async def _stream_tail(
    gen: Generation, rid: str, kind: str, model: str, include_usage: bool, count: int
) -> AsyncIterator[bytes]:
    if include_usage:
        body = proto.envelope(rid, kind, model, [])
        body["usage"] = proto.usage(gen, count)
        yield sse(body)
    yield sse("[DONE]")
