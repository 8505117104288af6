"""OpenAI-compatible request parsing and response shapes, as vLLM's server produces them."""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from typing import Any

from jobs.simulator.engine import Generation
from jobs.simulator.outputs import SimulatedToken
from jobs.simulator.vllm_log import SamplingParamsView

SIMULATOR_FINGERPRINT = "prewarm-simulator"


class ProtocolError(ValueError):
    """A request that cannot be served as sent (HTTP 400)."""


def _number(body: Mapping[str, Any], key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"'{key}' must be a number")
    return float(value)


def _int(body: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"'{key}' must be an integer")
    return value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop)


def sampling_params(
    body: Mapping[str, Any], *, default_max_tokens: int, chat: bool
) -> SamplingParamsView:
    """vLLM's SamplingParams for a completions (``chat=False``) or chat request body."""
    if (_int(body, "n", 1) or 1) != 1:
        raise ProtocolError("the simulator serves n=1 only")
    max_key = (
        "max_completion_tokens" if chat and body.get("max_completion_tokens") else "max_tokens"
    )
    max_tokens = _int(body, max_key, default_max_tokens) or default_max_tokens
    if max_tokens < 1:
        raise ProtocolError("max_tokens must be at least 1")
    if chat:
        logprobs = (_int(body, "top_logprobs", 0) or 0) if body.get("logprobs") else None
    else:
        logprobs = _int(body, "logprobs", None)
    return SamplingParamsView(
        temperature=_number(body, "temperature", 1.0),
        top_p=_number(body, "top_p", 1.0),
        top_k=_int(body, "top_k", 0) or 0,
        seed=_int(body, "seed", None),
        stop=_stop(body),
        max_tokens=max_tokens,
        min_tokens=_int(body, "min_tokens", 0) or 0,
        logprobs=logprobs,
        ignore_eos=bool(body.get("ignore_eos", False)),
        presence_penalty=_number(body, "presence_penalty", 0.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0),
    )


def completion_prompts(body: Mapping[str, Any]) -> list[str | list[int]]:
    """The prompts of a completions request: text, a list of texts, ids or a list of id lists."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return [list(prompt)]
        if all(isinstance(p, list) and all(isinstance(i, int) for i in p) for p in prompt):
            return [list(p) for p in prompt]
    raise ProtocolError("'prompt' must be a string, a list of strings or a list of token ids")


def request_id(kind: str, header: str | None) -> tuple[str, str]:
    """vLLM's external request id (``chatcmpl-<16 hex>``, ``cmpl-<16 hex>``; the
    ``X-Request-Id`` header replaces the random part) and that random part alone."""
    random_part = header or secrets.token_hex(8)
    return f"{kind}-{random_part}", random_part


def usage(generation: Generation, completion_tokens: int) -> dict[str, Any]:
    """The usage block, with ``prompt_tokens_details.cached_tokens``."""
    return {
        "prompt_tokens": generation.prompt_tokens,
        "total_tokens": generation.prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": generation.cached_tokens},
    }


def completion_logprobs(tokens: list[SimulatedToken], offset: int = 0) -> dict[str, Any]:
    """Legacy completions logprobs: parallel lists plus top alternatives per position."""
    offsets, position = [], offset
    for token in tokens:
        offsets.append(position)
        position += len(token.text)
    return {
        "text_offset": offsets,
        "token_logprobs": [t.logprob for t in tokens],
        "tokens": [t.text for t in tokens],
        "top_logprobs": [dict(t.top) for t in tokens],
    }


def chat_logprobs(tokens: list[SimulatedToken]) -> dict[str, Any]:
    """Chat logprobs: one entry per token with its top alternatives."""

    def entry(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {
        "content": [
            {**entry(t.text, t.logprob), "top_logprobs": [entry(a, lp) for a, lp in t.top]}
            for t in tokens
        ]
    }


def envelope(rid: str, obj: str, model: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields every completion object and chunk shares."""
    return {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "system_fingerprint": SIMULATOR_FINGERPRINT,
    }


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's ErrorResponse (``{"error": {message, type, param, code}}``)."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}
