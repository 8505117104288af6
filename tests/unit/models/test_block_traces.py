"""The conversation regime of the generated corpus has the public trace's structure: measured
the same way on ``conversation_trace.jsonl`` and on generated traces, the request structure
(root block, conversations, gaps, chains) and the baselines' standing in 1-minute windows
agree within a tolerance — so the selection's property over the corpus speaks of that class."""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np
import pytest

from benchmarks.block_traces import ConversationShape, trace_counts
from models.baselines import EWMA, LastWindow, MovingAverage
from pipeline.evaluation import CountMatrix, WalkForwardConfig, walk_forward
from pipeline.ingest.traces import read_mooncake
from pipeline.windows import item_window_counts
from tests.conftest import SHARED_DATA

PUBLIC = SHARED_DATA / "traces" / "conversation_trace.jsonl"


def structure(requests: Iterable[dict[str, object]]) -> dict[str, float]:
    """Root share, share of requests that continue a conversation (keyed by the block after
    the root), median gap between turns (s), mean turns, median chain length (blocks)."""
    last_at: dict[int, float] = {}
    turns: dict[int, int] = {}
    gaps, lengths, roots = [], [], 0
    for request in requests:
        chain = list(request["hash_ids"])  # type: ignore[call-overload]
        at = float(request["timestamp"]) / 1000  # type: ignore[arg-type]
        roots += chain[0] == 0
        lengths.append(len(chain))
        if len(chain) < 2:
            continue
        key = chain[1]
        if key in last_at:
            gaps.append(at - last_at[key])
        last_at[key] = at
        turns[key] = turns.get(key, 0) + 1
    return {"root_share": roots / len(lengths), "continuing": len(gaps) / len(lengths),
            "gap_median_s": float(np.median(gaps)), "mean_turns": float(np.mean([*turns.values()])),
            "chain_median": float(np.median(lengths))}  # fmt: skip


def standing(matrix: CountMatrix) -> dict[str, float]:
    """Points of the history oracle the EWMA and the moving average rank above the last window,
    at 1,000 blocks, and the spread of the three at 100 blocks."""
    models = {"ewma": EWMA(), "moving_average": MovingAverage(), "last_window": LastWindow()}
    config = WalkForwardConfig(budget_items=(100, 1000), first_t=14, refit_every=1000)
    table = walk_forward(matrix, models, config).table
    share = table.pivot_table(index="model", columns="budget", values="share_of_history_oracle")
    top, wide = share["100 items"], share["1000 items"]
    return {"ewma_lead_1000": 100 * (wide["ewma"] - wide["last_window"]),
            "average_lead_1000": 100 * (wide["moving_average"] - wide["last_window"]),
            "spread_100": 100 * float(top.max() - top.min())}  # fmt: skip


@pytest.fixture(scope="module")
def public() -> dict[str, float]:
    rows = [json.loads(line) for line in PUBLIC.read_text().splitlines() if line.strip()]
    matrix = CountMatrix.from_counts(item_window_counts(read_mooncake(PUBLIC), "1min"))
    return {**structure(rows), **standing(matrix)}


@pytest.mark.parametrize("seed", [0, 1])
def test_a_generated_conversation_trace_has_the_public_traces_structure(tmp_path, public, seed):
    shape = ConversationShape()
    generated = structure(shape.requests(seed))
    assert generated["root_share"] == public["root_share"] == 1.0
    assert abs(generated["continuing"] - public["continuing"]) < 0.08, (generated, public)
    assert 0.7 < generated["gap_median_s"] / public["gap_median_s"] < 1.4, (generated, public)
    assert abs(generated["mean_turns"] - public["mean_turns"]) < 0.25, (generated, public)
    assert 0.7 < generated["chain_median"] / public["chain_median"] < 1.4, (generated, public)
    counts = trace_counts(tmp_path, shape, seed)
    ranks = standing(CountMatrix.from_counts(counts))
    # The public trace: the EWMA and the moving average rank the top 1,000 well above the last
    # window; at the top 100 the three lie close. A generated trace must do the same.
    for lead in ("ewma_lead_1000", "average_lead_1000"):
        assert public[lead] > 3.0 and ranks[lead] > 2.0, (ranks, public)
    assert public["spread_100"] < 4.0 and ranks["spread_100"] < 6.0, (ranks, public)
