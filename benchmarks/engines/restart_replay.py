"""A restart's warm-up and first window replayed on a real vLLM CPU server, request by request.

What :func:`benchmarks.moving_workload.replay` computes on the block-pool model, measured on the
engine: its prefix cache is cleared (``POST /reset_prefix_cache``: the restart), the arm's
primings are sent (``max_tokens=1``), then the window's requests one after another
(``max_tokens=4``); a first use is a hit when vLLM reports cached prompt tokens for it
(``usage.prompt_tokens_details.cached_tokens``, streamed as :mod:`benchmarks.engines.client`
sends every request — exact, free of timing noise). The replay stops
after the window's last first use: what follows cannot change a first-use hit.

Token ids are folded into the engine model's vocabulary: which prompts share whole blocks, the
only thing the cache sees, stays the same.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import httpx

from benchmarks.engines.client import PATHS, stream
from benchmarks.engines.engine import SERVED_NAME


def vocabulary(model_dir: Path) -> int:
    """The engine model's vocabulary size (``config.json``)."""
    return int(json.loads((model_dir / "config.json").read_text())["vocab_size"])


def fold(ids: Sequence[int], vocab: int) -> list[int]:
    """Token ids mapped into ``1 .. vocab - 1`` (distinct heads stay distinct)."""
    return [1 + int(x) % (vocab - 1) for x in ids]


def cached_tokens(client: httpx.Client, ids: list[int], max_tokens: int) -> int:
    """Send one completion of token ids; the prompt tokens vLLM served from its cache."""
    body = {"model": SERVED_NAME, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0}
    _, usage = stream(client, PATHS["completion"], body)
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def engine_first_use_hits(
    client: httpx.Client,
    priming: Sequence[Sequence[int]],
    future: Sequence[tuple[int, Sequence[int]]],
    vocab: int,
) -> int:
    """First uses served from the engine's cache after a cleared cache and ``priming``."""
    client.post("/reset_prefix_cache").raise_for_status()
    for ids in priming:
        cached_tokens(client, fold(ids, vocab), 1)
    firsts = {template: n for n, (template, _) in reversed(list(enumerate(future)))}
    last_first = max(firsts.values(), default=-1)
    hits = 0
    for n, (template, ids) in enumerate(future[: last_first + 1]):
        cached = cached_tokens(client, fold(ids, vocab), 4)
        if firsts[template] == n:
            hits += cached > 0
    return hits
