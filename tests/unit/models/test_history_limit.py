"""A busy fleet's history outgrows one matrix (a generated Mooncake-class trace of 3 hours in
1-minute windows: 367,902 blocks x 180 windows, over 60 million cells): the selection and the
forecast read its latest windows that fit, and say how many they left out, instead of refusing
every retraining after a few hours."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline.evaluation as evaluation
from models.persistence import load_model
from pipeline.errors import BadInputError
from pipeline.evaluation import CountMatrix, latest_windows_that_fit
from tasks.services.training import train_on_counts
from tests.unit.models.series import counts_from_matrix

MINUTE = pd.Timedelta(minutes=1)


def conversations(windows: int = 60, steady: int = 4, new: int = 30, seed: int = 0) -> np.ndarray:
    """A few items every window, and ``new`` items a window each seen there and in the next
    (a conversation's next turn): the items grow with the history."""
    rng = np.random.default_rng(seed)
    grid = np.zeros((steady + new * windows, windows))
    grid[:steady] = rng.poisson(20, size=(steady, windows)) + 1
    for w in range(windows):
        rows = slice(steady + new * w, steady + new * (w + 1))
        grid[rows, w : w + 2] = rng.integers(1, 4, size=(new, min(2, windows - w)))
    return grid


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.booleans(), min_size=2, max_size=12), min_size=1, max_size=12),
    st.integers(1, 200),
)
def test_the_latest_windows_that_fit_are_as_many_as_fit(rows, limit):
    width = max(len(r) for r in rows)
    grid = np.array([r + [False] * (width - len(r)) for r in rows], dtype=float)
    grid[0, 0] = grid[0, -1] = 1  # the history spans every column
    counts = counts_from_matrix(grid, MINUTE)
    kept, left_out = latest_windows_that_fit(counts, max_cells=limit)

    def cells(first: int) -> int:
        span = grid[:, first:]
        return int((span.sum(axis=1) > 0).sum()) * span.shape[1]

    starts = sorted(counts["window_start"].unique())
    if left_out == 0:  # all of it fits, or not even the last window does
        assert len(kept) == len(counts)
        assert cells(0) <= limit or cells(width - 1) > limit
        return
    first = int((starts[left_out] - starts[0]) / MINUTE)
    assert (
        kept["window_start"].min() == starts[left_out]
        and len(kept) == (counts["window_start"] >= starts[left_out]).sum()
    )
    assert cells(first) <= limit  # it fits
    before = int((starts[left_out - 1] - starts[0]) / MINUTE)
    assert cells(before) > limit  # one more window would not


def test_a_history_over_the_matrix_limit_is_trained_on_its_latest_windows(tmp_path, monkeypatch):
    grid = conversations()
    counts = counts_from_matrix(grid, MINUTE, kind="prefix")
    limit = 30_000  # of 1,804 items x 60 windows (108,240 cells)
    monkeypatch.setattr(evaluation, "MAX_CELLS", limit)
    with pytest.raises(BadInputError, match="too many cells"):
        CountMatrix.from_counts(counts)  # the whole history: refused, every retraining failed
    kept, left_out = latest_windows_that_fit(counts)
    assert 0 < left_out < 60
    matrix = CountMatrix.from_counts(kept)
    assert matrix.n_items * matrix.n_windows <= limit

    trained = train_on_counts(counts, "conversations", tmp_path)
    assert f"{left_out} older window(s) left out" in trained["note"]
    meta = json.loads((tmp_path / "hotness" / trained["version"] / "metadata.json").read_text())
    assert meta["extra"]["selection"]["windows_left_out"] == left_out
    assert meta["extra"]["selection"]["note"] == trained["note"]

    model = load_model(tmp_path, "hotness")
    ranking = model.predict_next(counts, kind="prefix")
    assert ranking["window_start"].iloc[0] == counts["window_start"].max() + MINUTE
    # the steady items lead, and every item of the last window is ranked
    assert set(ranking["item_key"][:4]) == {f"prefix-{i}" for i in range(4)}
    assert len(ranking) == matrix.n_items
