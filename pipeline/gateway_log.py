"""A gateway's request log (pure): what LiteLLM's proxy answered, as prewarm's callback writes it.

The callback (``jobs.litellm_log``) writes one JSON object a line, tagged ``"log":
"prewarm-litellm/1"``; :mod:`pipeline.ingest.formats.litellm_jsonl` reads it into records. A
record keeps the request as the client sent it (``request_body``: JSON in the client's field
order, less ``metadata``), so a warm-up can send that very request again: LiteLLM keys its
cache on the request's model group and OpenAI parameters, and only the gateway itself knows
that key exactly.

The callback imports this module inside the proxy's process: it needs the standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

LOG_TAG = "prewarm-litellm/1"

#: request fields that never reach LiteLLM's cache key (and carry nothing to replay); the proxy
#: adds ``litellm_call_id`` to every body it hands its callbacks
UNKEYED_FIELDS = frozenset({
    "metadata", "litellm_metadata", "litellm_call_id", "proxy_server_request", "secret_fields",
})  # fmt: skip

#: LiteLLM's call types → the endpoint a record names
_CALL_TYPES = {
    "completion": "chat", "acompletion": "chat",
    "text_completion": "completions", "atext_completion": "completions",
    "embedding": "embeddings", "aembedding": "embeddings",
}  # fmt: skip


def endpoint_of(call_type: str) -> str | None:
    """The endpoint (``chat``, ``completions``, ``embeddings``) of a LiteLLM call type."""
    return _CALL_TYPES.get(call_type)


def request_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request's fields that LiteLLM's cache key and the upstream see (less metadata)."""
    return {k: v for k, v in body.items() if k not in UNKEYED_FIELDS and v is not None}


def body_text(body: Mapping[str, Any]) -> str:
    """JSON of a request body with its fields in the client's order: LiteLLM builds its cache
    key from the parameters in the order they came, so a replay must keep it (two clients
    naming the same parameters in another order are two entries to LiteLLM, and to prewarm)."""
    return json.dumps(request_body(body), separators=(",", ":"), ensure_ascii=False)


def deterministic(body: Mapping[str, Any]) -> bool:
    """Whether a chat or completions request has one answer worth caching: greedy sampling
    (temperature 0) or a fixed seed, one choice, not streamed."""
    if body.get("stream") or int(body.get("n") or 1) != 1:
        return False
    temperature = body.get("temperature")
    greedy = isinstance(temperature, int | float) and float(temperature) == 0.0
    return greedy or isinstance(body.get("seed"), int)


def embedding_inputs(body: Mapping[str, Any]) -> list[str]:
    """The text inputs of an embeddings request (LiteLLM caches each input on its own)."""
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return []  # token-id inputs: not replayed
