"""The hotness forecaster and its baselines on a series with a daily pattern."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from models.baselines import ModelNotFittedError, baselines
from models.forecaster import HotnessForecaster
from pipeline.errors import BadInputError
from pipeline.evaluation import CountMatrix, WalkForwardConfig, coarsen_counts, walk_forward


def test_forecaster_beats_last_window_on_the_held_back_day(daily_counts):
    matrix = CountMatrix.from_counts(daily_counts)
    models = {**baselines(), "lightgbm": HotnessForecaster(n_estimators=100)}
    last_day = matrix.n_windows - 144
    # One fit on five days, judged on the sixth, never refit (refit_every > steps).
    config = WalkForwardConfig(budget_items=(4,), first_t=last_day - 1, refit_every=10_000)
    table = walk_forward(matrix, models, config).table.set_index("model")
    assert table.loc["lightgbm", "mae"] < 0.85 * table.loc["last_window", "mae"]
    assert table.loc["lightgbm", "mae"] < table.loc["moving_average", "mae"]


def test_predict_next_ranks_every_seen_item_for_the_following_window(daily_counts):
    model = HotnessForecaster(n_estimators=20).fit(CountMatrix.from_counts(daily_counts))
    ranking = model.predict_next(daily_counts)
    assert list(ranking.columns) == ["item_kind", "item_key", "window_start", "predicted"]
    assert ranking["item_key"].nunique() == daily_counts["item_key"].nunique()
    assert ranking["window_start"].iloc[0] == daily_counts["window_start"].max() + pd.Timedelta(
        minutes=10
    )
    assert ranking["predicted"].is_monotonic_decreasing
    assert (ranking["predicted"] >= 0).all()


@pytest.mark.parametrize("model", [*baselines().values(), HotnessForecaster()])
def test_predicting_before_fitting_is_a_clear_error(model, daily_counts):
    with pytest.raises(ModelNotFittedError, match="must be fitted"):
        model.predict_next(daily_counts)


def test_partial_fit_adds_trees_for_new_windows(daily_counts):
    matrix = CountMatrix.from_counts(daily_counts)
    model = HotnessForecaster(n_estimators=20, partial_rounds=5).fit(matrix, until=300)
    trees = model.booster_.num_trees()
    assert model.partial_fit(matrix) is model
    assert model.booster_.num_trees() == trees + 5
    assert model.trained_until_ == matrix.window_start(matrix.n_windows - 1)


def test_an_unknown_objective_is_refused(daily_counts):
    with pytest.raises(BadInputError, match="objective"):
        HotnessForecaster(objective="l2").fit(CountMatrix.from_counts(daily_counts))


def test_inactive_rows_are_subsampled_but_active_ones_kept():
    requests = np.zeros((400, 6))
    requests[:5, :] = 3  # five busy items
    requests[5:, 0] = 1  # many items seen once, idle afterwards
    from tests.unit.models.series import counts_from_matrix

    counts = counts_from_matrix(requests, pd.Timedelta(minutes=1), kind="prefix")
    model = HotnessForecaster(n_estimators=5, negatives_per_positive=2, min_child_samples=2)
    model.fit(CountMatrix.from_counts(counts))
    # 5 windows of history ends, 5 active rows each, about 2*5 (floor 50) inactive ones each.
    assert model.n_training_rows_ < 400


def test_predict_next_refuses_counts_of_another_window_length(daily_counts):
    model = HotnessForecaster(n_estimators=5).fit(CountMatrix.from_counts(daily_counts))
    coarse = coarsen_counts(daily_counts, pd.Timedelta(minutes=30))
    with pytest.raises(BadInputError, match="0 days 00:30:00 windows, the model was fitted on"):
        model.predict_next(coarse)
    one_window = daily_counts[daily_counts["window_start"] == daily_counts["window_start"].max()]
    assert len(model.predict_next(one_window)) == one_window["item_key"].nunique()


def test_validation_windows_choose_the_tree_count_on_the_latest_past(daily_counts):
    matrix = CountMatrix.from_counts(daily_counts)
    plain = HotnessForecaster(n_estimators=300, learning_rate=0.3).fit(matrix, until=400)
    checked = HotnessForecaster(
        n_estimators=300, learning_rate=0.3, validation_windows=48, patience=5
    ).fit(matrix, until=400)
    assert plain.n_rounds_ == 300
    assert 1 <= checked.n_rounds_ < 300  # stopped once the last 48 windows stopped improving
    assert checked.booster_.num_trees() == checked.n_rounds_
