"""Generated prefix-block traces for the selection's property, in two regimes of real traffic.

Each trace is written as a Mooncake JSONL file (``timestamp`` ms, ``input_length``,
``output_length``, ``hash_ids``) and read back through :func:`pipeline.ingest.traces.read_mooncake`
and :func:`pipeline.windows.item_window_counts`, the road a real trace takes.

* :class:`ConversationShape`, **conversations** (the class of the public Mooncake trace,
  ``../shared/data/traces/conversation_trace.jsonl``, measured there): one root block in every
  request and no other shared head; each conversation opens with a chain of a lognormal number
  of blocks (median 12-14, up to ~160), and its later turns, each the previous chain plus 0-9
  new blocks (median 1), come a lognormal gap apart (median ~2 minutes, 10th-90th percentile
  ~40-480 s). The turn counts are heavy-tailed (Zipf: a mean of ~1.6, 99th percentile ~8-10,
  a few of dozens), so a conversation that has gone on is likely to go on: what a window's
  hot set keeps from the windows before it. The volume swings mildly (a coefficient of
  variation of ~0.12 a minute). On the public trace at 1-minute windows, the EWMA, moving
  average and frequency estimate rank the top 1,000 blocks ~5-7 points of the history oracle
  above the last window, and at the top 100 the baselines lie within ~3 points: so do these.
* :class:`TraceShape`, **shared heads** (tool- or agent-style traffic): a dozen system-prompt
  heads of 1-12 blocks carry most requests, their popularity swinging on 15-90 minute periods,
  with bursts of 2-5x and short sessions of 5-120 s gaps. Much more concentrated than the
  public trace (the top 20 blocks hold ~95% of the history oracle, against ~65% of the top 100
  there), it stresses the top of the ranking, where the last window wins.
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
    """The knobs of one shared-heads trace (defaults: an hour at ~40 requests a minute)."""

    minutes: int = 60
    rate: float = 40.0  # requests a minute outside bursts
    heads: int = 12  # system-prompt heads
    burst_chance: float = 0.08  # per minute
    mean_turns: float = 3.0
    root_share: float = 0.9  # requests that start with the shared root block

    def requests(self, seed: int) -> list[dict[str, object]]:
        """The requests of one trace of this shape (:func:`trace_requests`)."""
        return trace_requests(self, seed)


@dataclass(frozen=True)
class ConversationShape:
    """The knobs of one conversation trace (defaults: an hour at ~200 requests a minute, as
    the public trace)."""

    minutes: int = 60
    rate: float = 200.0  # requests a minute
    turns_exponent: float = 2.5  # Zipf exponent of a conversation's turns (~1.6 seen in an hour)
    max_turns: int = 60
    gap_median_s: float = 130.0  # the median conversation's median gap between turns
    cadence_sigma: float = 0.35  # of a conversation's log median gap, across conversations
    gap_sigma: float = 0.8  # of the log gap, within a conversation
    first_blocks_median: float = 12.0
    first_blocks_sigma: float = 0.9  # of the log block count of a first turn
    max_blocks: int = 160
    volume_sigma: float = 0.12  # of the minute's log volume (AR(1), 0.5 a minute)
    lead_in_minutes: int = 10  # conversations begun before the trace opens

    def requests(self, seed: int) -> list[dict[str, object]]:
        """The requests of one trace of this shape (:func:`conversation_requests`)."""
        return conversation_requests(self, seed)


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
    return _as_jsonl(requests, shape.minutes * 60, rng)


def _conversation_starts(shape: ConversationShape, rng: np.random.Generator) -> np.ndarray:
    """Conversations begun a minute: the rate over the mean turns, times a mild AR(1) swing."""
    mean_turns = float(np.mean(np.minimum(rng.zipf(shape.turns_exponent, 10_000), shape.max_turns)))
    swing, level = np.zeros(shape.minutes), 0.0
    for minute in range(shape.minutes):
        level = 0.5 * level + rng.normal(0.0, shape.volume_sigma)
        swing[minute] = level
    return shape.rate / mean_turns * np.exp(swing)


def conversation_requests(shape: ConversationShape, seed: int) -> list[dict[str, object]]:
    """The requests of one conversation trace, in time order, as Mooncake JSONL objects."""
    rng = np.random.default_rng(seed)
    next_id = iter(range(1, 10**9))
    starts = _conversation_starts(shape, rng)
    requests: list[tuple[float, list[int]]] = []
    for minute in range(-shape.lead_in_minutes, shape.minutes):
        for start in minute * 60 + rng.uniform(0, 60, size=rng.poisson(starts[max(minute, 0)])):
            first = rng.lognormal(np.log(shape.first_blocks_median), shape.first_blocks_sigma)
            chain = [0] + [next(next_id) for _ in range(int(np.clip(first, 1, shape.max_blocks)))]
            cadence = rng.lognormal(np.log(shape.gap_median_s), shape.cadence_sigma)
            at = float(start)
            for _ in range(min(int(rng.zipf(shape.turns_exponent)), shape.max_turns)):
                if at >= 0:
                    requests.append((at, list(chain)))
                chain += [next(next_id) for _ in range(int(rng.geometric(0.45)) - 1)]
                at += float(rng.lognormal(np.log(cadence), shape.gap_sigma))
    return _as_jsonl(requests, shape.minutes * 60, rng)


def _as_jsonl(
    requests: list[tuple[float, list[int]]], end: float, rng: np.random.Generator
) -> list[dict[str, object]]:
    """``(at, chain)`` pairs before ``end`` seconds, in time order, as Mooncake JSONL objects."""
    requests.sort(key=lambda r: r[0])
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


Shape = TraceShape | ConversationShape


def write_trace(path: Path, shape: Shape, seed: int) -> Path:
    """Write one trace as Mooncake JSONL; returns ``path``."""
    lines = (json.dumps(request) for request in shape.requests(seed))
    path.write_text("\n".join(lines) + "\n")
    return path


def trace_counts(folder: Path, shape: Shape, seed: int, window: str = "1min") -> pd.DataFrame:
    """The prefix-block counts of one generated trace, through the trace reader and windows."""
    path = write_trace(folder / f"block-trace-{seed}.jsonl", shape, seed)
    return item_window_counts(read_mooncake(path), window)
