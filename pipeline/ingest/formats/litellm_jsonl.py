"""LiteLLM's request log as prewarm's callback writes it (:mod:`pipeline.gateway_log`).

One JSON object a line, ``"log": "prewarm-litellm/1"``: ``ts`` (seconds since the epoch),
``request_id``, ``endpoint`` (``chat``, ``completions``, ``embeddings``), ``model`` (the model
group), ``deployment``, ``request`` (the request as the client sent it, an object),
``cache_hit``, ``cache_key``, ``prompt_tokens``, ``output_tokens``, ``e2e_s``, ``status``. A
line without ``ts`` or ``request``, or with a field of the wrong type, is a reject naming the
line and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.gateway_log import LOG_TAG, body_text
from pipeline.ingest import traces
from pipeline.ingest.formats.base import TraceFormat
from pipeline.ingest.lines import LineReader
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.summary import Rejects
from pipeline.prefix_blocks import block_hashes

_ENDPOINTS = ("chat", "completions", "embeddings")
_SAMPLING = {"temperature": float, "top_p": float, "max_tokens": int, "seed": int}


def _field(obj: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TypeError(f"field {name!r}: {type(value).__name__} is not {_name(kind)}")
    return value


def _name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__


def _prompt(endpoint: str, body: dict[str, Any]) -> str | None:
    """The prompt text where the request has one that an engine's prefix cache sees as it is
    (a completions prompt); a chat request's messages are rendered by the engine's chat
    template, and an embeddings input is no prompt prefix, so both leave ``prompt`` missing
    (their requests are in ``request_body``)."""
    if endpoint == "completions" and isinstance(body.get("prompt"), str):
        return str(body["prompt"])
    return None


def litellm_row(obj: dict[str, Any], block_size: int) -> dict[str, Any]:
    """One record from one log line (raises TypeError/ValueError/KeyError naming the field)."""
    body = obj["request"]
    if not isinstance(body, dict):
        raise TypeError("field 'request': expected an object")
    endpoint = obj.get("endpoint")
    if endpoint not in _ENDPOINTS:
        raise ValueError(f"field 'endpoint': {endpoint!r} is not one of {_ENDPOINTS}")
    ts = _field(obj, "ts", (int, float))
    if ts is None:
        raise KeyError("ts")
    prompt = _prompt(endpoint, body)
    row: dict[str, Any] = {
        "ts": pd.Timestamp(ts, unit="s", tz="UTC"), "source": "gateway",
        "request_id": _field(obj, "request_id", str), "endpoint": endpoint,
        "model": _field(obj, "model", str), "deployment": _field(obj, "deployment", str),
        "request_body": body_text(body), "cache_hit": _field(obj, "cache_hit", bool),
        "prompt": prompt, "prefix_hashes": block_hashes(prompt, block_size) if prompt else None,
        "prompt_tokens": _field(obj, "prompt_tokens", int),
        "output_tokens": _field(obj, "output_tokens", int),
        "e2e_s": _field(obj, "e2e_s", (int, float)), "status": _field(obj, "status", str),
    }  # fmt: skip
    for name, kind in _SAMPLING.items():
        value = body.get(name)
        if value is not None and not isinstance(value, bool) and isinstance(value, int | float):
            row[name] = kind(value)
    return row


@dataclass(frozen=True)
class LitellmJsonlFormat(TraceFormat):
    """prewarm's LiteLLM callback log: one tagged JSON object a line."""

    def matches(self, line: str) -> bool:
        obj = traces.json_object(line)
        return obj is not None and obj.get("log") == LOG_TAG

    def read(
        self, path: Path, rejects: Rejects, options: IngestOptions, reader: LineReader
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        def parse(line: str, line_no: int) -> dict[str, Any]:
            obj = json.loads(line)
            if not isinstance(obj, dict) or obj.get("log") != LOG_TAG:
                raise ValueError(f"not a line of {LOG_TAG}")
            return litellm_row(obj, options.block_size)

        return traces.rows_of(path, rejects, parse, reader, detail=True), []


# Before prewarm-jsonl (rank 70), which takes any object with a "ts".
FORMAT = LitellmJsonlFormat("litellm-jsonl", "gateway", rank=60)
