"""Walk-forward evaluation on a table small enough to check by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from models.baselines import LastWindow, MovingAverage
from pipeline.errors import BadInputError
from pipeline.evaluation import (
    CountMatrix,
    WalkForwardConfig,
    coarsen_counts,
    held_out_margins,
    walk_forward,
)
from pipeline.evaluation import _top as top_positions
from tests.unit.models.series import counts_from_matrix

# item 0 steady, item 1 bursts in window 1 only, item 2 appears in window 2, item 3 new at 3.
REQUESTS = np.array(
    [
        [5, 5, 5, 5],
        [0, 9, 0, 0],
        [0, 0, 2, 2],
        [0, 0, 0, 7],
    ],
    dtype=float,
)


@pytest.fixture
def matrix() -> CountMatrix:
    return CountMatrix.from_counts(counts_from_matrix(REQUESTS, pd.Timedelta(minutes=5)))


def test_matrix_keeps_counts_on_a_regular_grid(matrix):
    assert (matrix.n_items, matrix.n_windows) == (4, 4)
    assert matrix.requests.sum() == REQUESTS.sum()
    assert list(matrix.first_seen) == [0, 1, 2, 3]
    assert matrix.window == pd.Timedelta(minutes=5)


def test_walk_forward_shares_match_a_hand_count(matrix):
    models = {"last": LastWindow(), "ma": MovingAverage(windows=4)}
    result = walk_forward(matrix, models, WalkForwardConfig(budget_items=(1,), first_t=1))
    table = result.table.set_index("model")
    # t=1 -> window 2 (total 7): last picks item 1 (9) -> 0; ma picks item 1 (4.5) -> 0.
    # t=2 -> window 3 (total 14): last picks item 0 -> 5; ma picks item 0 (5) -> 5.
    # oracle: 5 + 7 = 12; history oracle: 5 + 5 = 10 (item 3 is new in window 3).
    assert table.loc["last", "captured_share"] == pytest.approx(5 / 21)
    assert table.loc["last", "share_of_history_oracle"] == pytest.approx(5 / 10)
    assert table.loc["last", "share_of_oracle"] == pytest.approx(5 / 12)
    # MAE of "last" over seen + next-window items: t=1: |5-5|+|9-0|+|0-2| over 3 items;
    # t=2: |5-5|+|0-0|+|2-2|+|0-7| over 4 items -> (11 + 7) / 7.
    assert table.loc["last", "mae"] == pytest.approx(18 / 7)


def test_first_uses_count_each_used_item_once():
    # item 0 trickles, item 1 bursts in windows 0 and 2: warming item 0 for window 2 catches a
    # tenth of its requests, and one first use of the one a budget of one item can take
    requests = np.array([[1, 1, 1], [5, 0, 10]], dtype=float)
    matrix = CountMatrix.from_counts(counts_from_matrix(requests, pd.Timedelta(minutes=5)))
    config = WalkForwardConfig(budget_items=(1,), first_t=1)
    row = walk_forward(matrix, {"last": LastWindow()}, config).table.set_index("model").loc["last"]
    assert row["share_of_history_oracle"] == pytest.approx(1 / 10)
    assert row["first_use_share_of_history_oracle"] == pytest.approx(1.0)


def test_a_token_budget_takes_items_while_their_cost_fits(matrix):
    # every item costs 100 prompt tokens per request: 150 tokens buy one item.
    result = walk_forward(
        matrix,
        {"last": LastWindow()},
        WalkForwardConfig(budget_items=(), budget_tokens=(150,), first_t=2),
    )
    assert result.table.loc[0, "captured_share"] == pytest.approx(5 / 14)


def test_too_few_windows_is_bad_input(matrix):
    with pytest.raises(BadInputError, match="nothing to test"):
        walk_forward(matrix, {"last": LastWindow()}, WalkForwardConfig(first_t=3))


def test_counts_without_required_columns_are_refused():
    with pytest.raises(BadInputError, match="requests"):
        CountMatrix.from_counts(pd.DataFrame({"item_kind": [], "item_key": [], "window_start": []}))


def test_several_budgets_are_judged_on_one_run(matrix):
    config = WalkForwardConfig(budget_items=(1, 2), budget_tokens=(150,), first_t=1)
    table = walk_forward(matrix, {"last": LastWindow()}, config).table.set_index("budget")
    assert list(table.index) == ["1 items", "2 items", "150 tokens"]
    # t=1: last picks items 1 and 0 -> 5 of 7; t=2: items 0 and 2 -> 7 of 14.
    assert table.loc["2 items", "captured_share"] == pytest.approx(12 / 21)
    assert table.loc["2 items", "mae"] == table.loc["1 items", "mae"]


def test_counts_coarsen_into_longer_windows():
    counts = counts_from_matrix(REQUESTS, pd.Timedelta(minutes=5))
    coarse = coarsen_counts(counts, pd.Timedelta(minutes=10))
    matrix = CountMatrix.from_counts(coarse)
    assert matrix.window == pd.Timedelta(minutes=10)
    assert matrix.requests.sum() == REQUESTS.sum()
    with pytest.raises(BadInputError, match="cannot turn"):
        coarsen_counts(counts, pd.Timedelta(minutes=7))


def test_timing_columns_become_grids_and_recency_features():
    from models.features import FEATURE_NAMES, features_at
    from pipeline.records import records_frame
    from pipeline.windows import item_window_counts

    t0 = pd.Timestamp("2025-01-01T00:00:00Z")
    rows = [
        {"ts": t0 + pd.Timedelta(seconds=30), "prefix_hashes": ["a", "b"]},
        {"ts": t0 + pd.Timedelta(seconds=290), "prefix_hashes": ["a", "c"]},
        {"ts": t0 + pd.Timedelta(seconds=400), "prefix_hashes": ["a"]},
    ]
    counts = item_window_counts(records_frame(rows), "5min", timing=True)
    timed = CountMatrix.from_counts(counts[counts.item_kind == "prefix"])
    plain = CountMatrix.from_counts(item_window_counts(records_frame(rows), "5min"))
    assert plain.timing is None and timed.timing is not None
    names = list(timed.items["item_key"])
    rows_at_0 = features_at(timed, 0, np.arange(timed.n_items))
    recency = dict(zip(names, rows_at_0[:, FEATURE_NAMES.index("recency")], strict=True))
    # b was last used 270 s before the window's end, c 10 s before: 0.9 and 1/30 of a window.
    assert recency["b"] == pytest.approx(0.9) and recency["c"] == pytest.approx(1 / 30)
    rows_at_1 = features_at(timed, 1, np.arange(timed.n_items))
    recency_1 = dict(zip(names, rows_at_1[:, FEATURE_NAMES.index("recency")], strict=True))
    assert recency_1["b"] == pytest.approx(1.9)  # one more window of silence
    depth = dict(zip(names, rows_at_0[:, FEATURE_NAMES.index("chain_depth")], strict=True))
    assert (depth["a"], depth["b"]) == (0, 1)
    untimed = features_at(plain, 0, np.arange(plain.n_items))
    assert np.isnan(untimed[:, FEATURE_NAMES.index("recency")]).all()


def _steps(captured: dict[str, list[float]], abs_error: dict[str, float]) -> pd.DataFrame:
    """Steps of one budget over as many windows as ``captured`` has values, a history oracle of
    10 each; ``abs_error[model]`` a window over 10 items."""
    return pd.DataFrame(
        [{"budget": "5 items", "t": t, "model": model, "captured": value,
          "history_oracle": 10.0, "abs_error": abs_error[model], "n_scored": 10}
         for model, values in captured.items() for t, value in enumerate(values)]
    )  # fmt: skip


def test_the_held_out_margin_is_stated_in_the_noise_of_the_paired_difference():
    errors = {"selected": 10.0, "ewma": 15.0, "last_window": 10.0}
    steps = _steps({"selected": [7, 7, 6], "ewma": [8, 6, 7], "last_window": [5, 5, 5]}, errors)
    row = held_out_margins(steps, "selected", ["ewma", "last_window"]).iloc[0]
    # Against the EWMA (21 of 30): -1 of 30 is -3.33 points; the differences -1, 1, -1 have a
    # standard deviation of 1.155, sqrt(3) of it over 30 is 6.67 points; the bound -(1 + 13.33).
    assert row["baseline"] == "ewma" and row["mae_baseline"] == "last_window"
    assert row["margin"] == pytest.approx(-100 / 30)
    assert row["se"] == pytest.approx(200 / 30)
    assert row["bound"] == pytest.approx(-(1 + 400 / 30))
    assert row["share_ok"] and row["mae_ratio"] == pytest.approx(1.0) and row["holds"]
    # Behind at every window by 6 to 8 of 10: far outside its noise.
    lost = _steps({"selected": [0, 0, 0], "ewma": [8, 6, 7], "last_window": [5, 5, 5]}, errors)
    row = held_out_margins(lost, "selected", ["ewma", "last_window"]).iloc[0]
    assert row["margin"] == pytest.approx(-70.0) and not row["share_ok"] and not row["holds"]
    # The MAE 2% above the lowest baseline's breaks it too, whatever the share.
    worse = _steps({"selected": [8, 6, 7], "ewma": [8, 6, 7]}, {"selected": 10.3, "ewma": 10.0})
    row = held_out_margins(worse, "selected", ["ewma"]).iloc[0]
    assert row["share_ok"] and not row["mae_ok"] and not row["holds"]


def test_held_out_margins_need_the_model_and_a_baseline():
    steps = _steps({"selected": [1, 2], "ewma": [2, 2]}, {"selected": 1.0, "ewma": 1.0})
    with pytest.raises(BadInputError, match="no steps of 'lightgbm'"):
        held_out_margins(steps, "lightgbm", ["ewma"])
    with pytest.raises(BadInputError, match="none of the baselines"):
        held_out_margins(steps, "selected", ["moving_average"])
    with pytest.raises(BadInputError, match="missing column"):
        held_out_margins(steps.drop(columns="captured"), "selected", ["ewma"])


@given(
    st.lists(st.integers(0, 4) | st.floats(0, 10, allow_nan=False), min_size=1, max_size=300),
    st.integers(1, 300),
)
def test_the_top_scores_are_the_ones_a_stable_sort_puts_first(values, k):
    """Budgets pick the ``k`` best items by a partition; ties (most scores are equal: zero, or
    small counts) go by position, as a stable sort of the negated scores takes them."""
    scores = np.asarray(values, dtype=float)
    k = min(k, len(scores))
    expected = np.argsort(-scores, kind="stable")[:k]
    assert sorted(top_positions(scores, k)) == sorted(expected)
