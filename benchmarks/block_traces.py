"""A corpus of generated prefix-block traces of the Mooncake class, for the selection's property.

Each trace is written as a Mooncake JSONL file (``timestamp`` ms, ``input_length``,
``output_length``, ``hash_ids``) and read back through :func:`pipeline.ingest.traces.read_mooncake`
and :func:`pipeline.windows.item_window_counts`, the road a real trace takes. Its structure
follows the public traces in ``../shared/data/traces`` (SOURCES.md):

* bursty 1-minute windows: a base rate with bursts of 2-5x lasting a few minutes, as the Azure
  ``code`` trace (0-632 requests a minute);
* block-hash chains: every request's hashes are a chain — a root block most requests share
  (Mooncake's block 0), a system-prompt head of 1-12 blocks, then the session's own context;
* sessions: a conversation of a few turns, each turn's chain the previous one's plus 1-4 new
  blocks, turns 5-120 s apart, so a session spans several windows (Mooncake's conversations);
* popularity that drifts within an hour: each head's weight swings on a period of 15-90
  minutes and some heads appear or retire mid-trace, so the hot set moves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.ingest.traces import read_mooncake
from pipeline.windows import item_window_counts

BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TraceShape:
    """The knobs of one generated trace (defaults: an hour at ~40 requests a minute)."""

    minutes: int = 60
    rate: float = 40.0  # requests a minute outside bursts
    heads: int = 12  # system-prompt heads
    burst_chance: float = 0.08  # per minute
    mean_turns: float = 3.0
    root_share: float = 0.9  # requests that start with the shared root block


def _head_weights(shape: TraceShape, rng: np.random.Generator) -> np.ndarray:
    """(heads, minutes) popularity: log-weights swinging on 15-90 minute periods; some heads
    start late or retire early."""
    t = np.arange(shape.minutes)[None, :]
    period = rng.uniform(15, 90, size=(shape.heads, 1))
    phase = rng.uniform(0, 2 * np.pi, size=(shape.heads, 1))
    level = rng.normal(0, 1, size=(shape.heads, 1))
    swing = rng.uniform(0.5, 2.0, size=(shape.heads, 1))
    weights = np.exp(level + swing * np.sin(2 * np.pi * t / period + phase))
    born = np.where(rng.random(shape.heads) < 0.3, rng.integers(0, shape.minutes, shape.heads), 0)
    retired = np.where(rng.random(shape.heads) < 0.3, rng.integers(0, shape.minutes, shape.heads),
                       shape.minutes)  # fmt: skip
    alive = (t >= born[:, None]) & ((t < retired[:, None]) | (retired[:, None] <= born[:, None]))
    return weights * alive


def _minute_rates(shape: TraceShape, rng: np.random.Generator) -> np.ndarray:
    """Session starts a minute: the base rate over mean turns, times bursts."""
    multiplier = np.ones(shape.minutes)
    minute = 0
    while minute < shape.minutes:
        if rng.random() < shape.burst_chance:
            length = int(rng.geometric(0.4))
            multiplier[minute : minute + length] = rng.uniform(2, 5)
            minute += length
        minute += 1
    return shape.rate / shape.mean_turns * multiplier


def trace_requests(shape: TraceShape, seed: int) -> list[dict[str, object]]:
    """The requests of one trace, in time order, as Mooncake JSONL objects."""
    rng = np.random.default_rng(seed)
    next_id = iter(range(1, 10**9))
    heads = [[next(next_id) for _ in range(rng.integers(1, 13))] for _ in range(shape.heads)]
    weights = _head_weights(shape, rng)
    rates = _minute_rates(shape, rng)
    requests: list[tuple[float, list[int]]] = []
    for minute, rate in enumerate(rates):
        alive = weights[:, minute]
        if alive.sum() == 0:
            continue
        for start in minute * 60 + rng.uniform(0, 60, size=rng.poisson(rate)):
            head = heads[rng.choice(shape.heads, p=alive / alive.sum())]
            root = [0] if rng.random() < shape.root_share else []
            context: list[int] = []
            at = float(start)
            for _ in range(int(rng.geometric(1 / shape.mean_turns))):
                context += [next(next_id) for _ in range(rng.integers(1, 5))]
                requests.append((at, root + head + context))
                at += float(rng.uniform(5, 120))
    requests.sort(key=lambda r: r[0])
    end = shape.minutes * 60
    return [
        {
            "timestamp": int(at * 1000),
            "input_length": len(chain) * BLOCK_TOKENS - int(rng.integers(0, BLOCK_TOKENS)),
            "output_length": int(rng.integers(1, 400)),
            "hash_ids": chain,
        }
        for at, chain in requests
        if at < end
    ]


def write_trace(path: Path, shape: TraceShape, seed: int) -> Path:
    """Write one trace as Mooncake JSONL; returns ``path``."""
    lines = (json.dumps(request) for request in trace_requests(shape, seed))
    path.write_text("\n".join(lines) + "\n")
    return path


def trace_counts(folder: Path, shape: TraceShape, seed: int, window: str = "1min") -> pd.DataFrame:
    """The prefix-block counts of one generated trace, through the trace reader and windows."""
    path = write_trace(folder / f"block-trace-{seed}.jsonl", shape, seed)
    return item_window_counts(read_mooncake(path), window)
