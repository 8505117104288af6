"""Values inside vLLM lines: the endpoint a request id names, ``SamplingParams`` fields, and
the parts of the periodic stats lines (FORMATS.md 1.4, 1.5, 1.8)."""

from __future__ import annotations

import re
from typing import Any

from pipeline.ingest.reprs import as_float, as_int, key_values, params_hash, seed_u64

_STAT = re.compile(r"([A-Za-z][A-Za-z ]*?): (-?\d+(?:\.\d+)?)")
_V0_PREFIX_RATE = re.compile(r"GPU: (-?[\d.]+)%, CPU: (-?[\d.]+)%")
#: stats label -> (metrics column, factor): percentages become fractions
_STAT_COLUMNS = {
    "Avg prompt throughput": ("prompt_throughput", 1.0),
    "Avg generation throughput": ("throughput", 1.0),
    "Running": ("running", 1.0),
    "Waiting": ("waiting", 1.0),
    "Pending": ("waiting", 1.0),
    "Swapped": ("swapped", 1.0),
    "Deferred": ("deferred", 1.0),
    "Preemptions": ("preemptions", 1.0),
    "GPU KV cache usage": ("kv_usage", 0.01),
    "CPU KV cache usage": ("cpu_kv_usage", 0.01),
    "Prefix cache hit rate": ("prefix_cache_hit_rate", 0.01),
    "External prefix cache hit rate": ("external_prefix_cache_hit_rate", 0.01),
    "MM cache hit rate": ("mm_cache_hit_rate", 0.01),
}


#: the routes of vLLM's OpenAI-compatible server that run a request on the engine (a failed
#: call of one is a request rejected before the engine); every other route (``/tokenize``,
#: ``/v1/completions/render`` and ``/v1/chat/completions/render`` that ``vllm-router`` calls on
#: every replica per request, ``/health``, ``/metrics``, ``/v1/models``...) runs none
REQUEST_ROUTES = frozenset({
    "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses",
    "/v1/messages", "/v1/audio/transcriptions", "/v1/audio/translations", "/pooling",
    "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank",
    "/inference/v1/generate", "/invocations", "/generate",
})  # fmt: skip


def runs_requests(route: str) -> bool:
    """Whether a call of ``route`` (a path, no query) runs a request on the engine."""
    return route.rstrip("/") in REQUEST_ROUTES


def endpoint_of(request_id: str) -> str | None:
    """The OpenAI endpoint a request id names (FORMATS.md 1.5), or ``None``."""
    if request_id.startswith(("chatcmpl-", "chat-")):
        return "/v1/chat/completions"
    if request_id.startswith("cmpl-"):
        tail = request_id.rsplit("-", 1)[-1]
        # v0.4 chat ids were cmpl-<32 hex> without the -<i> suffix of completions
        return "/v1/completions" if tail.isdigit() else "/v1/chat/completions"
    return None


def sampling_fields(body: str) -> dict[str, Any]:
    """Record fields from the inside of ``SamplingParams(...)``."""
    values = key_values(body)
    if "guided_decoding" in values and "structured_outputs" not in values:
        values["structured_outputs"] = values["guided_decoding"]
    return {
        "temperature": as_float(values.get("temperature")),
        "top_p": as_float(values.get("top_p")),
        "top_k": as_int(values.get("top_k")),
        "max_tokens": as_int(values.get("max_tokens")),
        "seed": seed_u64(values.get("seed")),
        "params_hash": params_hash(values),
    }


def stats_values(msg: str) -> dict[str, float]:
    """Metrics columns of one stats message (V0 or V1; unknown parts are skipped)."""
    row: dict[str, float] = {}
    for label, value in _STAT.findall(msg):
        column = _STAT_COLUMNS.get(label)
        if column is not None:
            row[column[0]] = float(value) * column[1]
    return row


_STAT_PART = re.compile(r"[A-Za-z][A-Za-z ]*: -?\d+(?:\.\d+)?(?: tokens/s| reqs|%)?")


def whole_stats(msg: str) -> bool:
    """Whether a stats message is whole: every ``, ``-separated part a ``label: number[unit]``
    and the line ends where vLLM ends it (a percentage, ``%.`` in V0, or ``reqs``); a line cut
    inside a part fails."""
    body = msg[:-1] if msg.endswith("%.") else msg
    if not body.endswith(("%", " reqs", " reqs ")):
        return False
    return all(
        _STAT_PART.fullmatch(part)
        for part in body.rstrip().replace(" reqs GPU", " reqs, GPU").split(", ")
    )


def v0_prefix_rates(msg: str) -> dict[str, float] | None:
    """V0's ``Prefix cache hit rate: GPU: x%, CPU: y%`` line as fractions."""
    match = _V0_PREFIX_RATE.search(msg)
    if match is None:
        return None
    return {
        "prefix_cache_hit_rate": float(match.group(1)) / 100,
        "cpu_prefix_cache_hit_rate": float(match.group(2)) / 100,
    }
