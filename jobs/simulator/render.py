"""vLLM's render routes, which a router calls before it routes a request.

A current vLLM (0.30 and later) serves ``POST /v1/completions/render`` and
``POST /v1/chat/completions/render``: the request is preprocessed (chat template, tokenizer) but
not run, and the answer is the token-in request vLLM would run (its ``GenerateRequest``): a list
of them for completions (one per prompt), one for chat. ``vllm-router`` under ``cache_aware``
calls them on every worker for every request and falls back to ``/tokenize`` when they answer 404.

Nothing is scheduled and nothing is logged but the access line: a render is not a request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.simulator import protocol as proto
from jobs.simulator.chat import render_chat
from jobs.simulator.outputs import token_id
from pipeline.prefix_blocks import pseudo_token_spans

#: the request fields a render hands back as they came (vLLM keeps the stream fields too)
_ECHOED = ("stream", "stream_options", "cache_salt", "priority", "kv_transfer_params")


def prompt_ids(text: str) -> list[int]:
    """The simulator's token ids of ``text`` (its pseudo-tokens, as ``/tokenize`` counts them)."""
    return [token_id(text[a:b]) for a, b in pseudo_token_spans(text)]


def completion_render(body: Mapping[str, Any], model: str) -> list[dict[str, Any]]:
    """The body of ``/v1/completions/render``: one token-in request per prompt."""
    params = _params(body, chat=False)
    rid = proto.request_id("cmpl", None)[0]
    prompts = proto.completion_prompts(body)
    ids = [p if isinstance(p, list) else prompt_ids(p) for p in prompts]
    return [_generate_request(f"{rid}-{i}", one, params, body, model) for i, one in enumerate(ids)]


def chat_render(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The body of ``/v1/chat/completions/render``: the chat's token-in request."""
    text = render_chat(
        body.get("messages"), add_generation_prompt=body.get("add_generation_prompt", True)
    )
    rid = proto.request_id("chatcmpl", None)[0]
    return _generate_request(rid, prompt_ids(text), _params(body, chat=True), body, model)


def _params(body: Mapping[str, Any], *, chat: bool) -> dict[str, Any]:
    view = proto.sampling_params(body, default_max_tokens=16, chat=chat)
    return {
        "temperature": view.temperature, "top_p": view.top_p, "top_k": view.top_k,
        "seed": view.seed, "stop": list(view.stop), "max_tokens": view.max_tokens,
        "min_tokens": view.min_tokens, "logprobs": view.logprobs,
        "presence_penalty": view.presence_penalty,
        "frequency_penalty": view.frequency_penalty, "ignore_eos": view.ignore_eos,
    }  # fmt: skip


def _generate_request(
    rid: str, ids: list[int], params: dict[str, Any], body: Mapping[str, Any], model: str
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "request_id": rid,
        "token_ids": ids,
        "features": None,
        "sampling_params": params,
        "model": body.get("model") or model,
        "token_offsets": None,
    }
    out.update({key: body.get(key) for key in _ECHOED})
    return out
