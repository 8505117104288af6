"""Model selection by backtest: the winner is never worse than a baseline on later windows."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from models.backtest import Backtest, BacktestPlan, run_backtest
from models.baselines import baselines, simple_models
from models.features import FEATURE_NAMES, features_at
from models.persistence import save_model
from models.selection import (
    FIRST_TIER_ORIGIN,
    SelectedForecaster,
    baseline_tiers,
    choose,
    load_selected,
    saved_selection,
    selection_metadata,
    shortfall,
    with_tiered,
)
from models.tiered import TieredRanking
from pipeline.errors import BadInputError
from pipeline.evaluation import CountMatrix, WalkForwardConfig, walk_forward
from tests.unit.models.series import counts_from_matrix, daily_series

WINDOW = pd.Timedelta(minutes=10)


def _moving_day(items: int = 12, days: int = 4, seed: int = 1) -> np.ndarray:
    """Tenants whose rate swings with the day, out of phase with each other: the top set
    changes through the day, so recency alone lags behind it."""
    rng = np.random.default_rng(seed)
    phase = 2 * np.pi * np.arange(days * 144) / 144
    shift = np.linspace(0, 2 * np.pi, items, endpoint=False)[:, None]
    rate = 20 * (1 + 0.95 * np.sin(phase[None, :] + shift))
    return rng.poisson(rate).astype(float)


@pytest.fixture(scope="module")
def moving() -> CountMatrix:
    return CountMatrix.from_counts(counts_from_matrix(_moving_day(), WINDOW))


@pytest.mark.timeout(900)  # three selections: minutes on the shared, loaded 2 cores
def test_selected_model_is_no_worse_than_the_best_baseline_on_later_windows(moving):
    # Selection sees only the history before each refit; it is judged on the windows after.
    config = WalkForwardConfig(budget_items=(3,), first_t=2 * 144, refit_every=96)
    selected = SelectedForecaster((3,), backtest=24)  # 24 origins: the three selections in ~1 min
    table = walk_forward(moving, {**baselines(), "selected": selected}, config)
    rows = table.table.set_index("model")
    best_share = rows.loc[list(baselines()), "share_of_history_oracle"].max()
    best_mae = rows.loc[list(baselines()), "mae"].min()
    assert rows.loc["selected", "share_of_history_oracle"] >= best_share - 0.01
    assert rows.loc["selected", "mae"] <= best_mae * 1.02


def test_few_windows_compete_with_baselines_only_and_say_so():
    matrix = CountMatrix.from_counts(counts_from_matrix(_moving_day(days=1)[:, :8], WINDOW))
    selected = SelectedForecaster((3,)).fit(matrix)
    assert not any(name.startswith("lightgbm") for name in selected.table_["model"])
    assert "only" in selected.note_ and "too few for LightGBM" in selected.note_
    assert selected.winner_name_ in set(selected.table_["model"])


def test_a_long_history_lets_lightgbm_compete(moving):
    selected = SelectedForecaster((3,)).fit(moving)
    assert {"lightgbm_poisson", "lightgbm_median"} <= set(selected.table_["model"])
    assert selected.winner_name_ in set(selected.table_["model"])
    assert selected.report()["margin"]["origins"] >= 6


def test_the_backtest_scores_first_uses_when_asked_and_says_so(moving):
    by_requests = SelectedForecaster((3,), learning=False).fit(moving)
    by_first_uses = SelectedForecaster((3,), learning=False, metric="first_uses").fit(moving)
    assert by_first_uses.report()["metric"] == "first_uses"
    assert by_requests.report()["metric"] == "requests"
    shares = by_requests.table_.set_index("model")["share"]
    assert not np.allclose(shares, by_first_uses.table_.set_index("model")["share"])
    with pytest.raises(BadInputError, match="unknown metric 'tokens'"):
        SelectedForecaster((3,), metric="tokens")


def test_the_blend_candidate_shares_the_median_booster_and_mixes_the_average(moving):
    from models.baselines import MovingAverage
    from models.forecaster import HotnessForecaster

    median = HotnessForecaster(objective="median", n_estimators=10)
    blend = median.blended(0.5)
    end = moving.n_windows - 2
    median.fit(moving, end)
    blend.fit(moving, end)
    assert blend.booster_ is median.booster_  # one training for the two
    items = np.arange(moving.n_items)
    expected = 0.5 * median.predict_at(moving, end, items) + 0.5 * MovingAverage().fit(
        moving, end
    ).predict_at(moving, end, items)
    np.testing.assert_allclose(blend.predict_at(moving, end, items), expected)
    blend.fit(moving, end - 1)  # another history: its own training
    assert blend.booster_ is not median.booster_
    assert blend.get_params()["blend"] == 0.5 and "_twin" not in blend.get_params()
    with pytest.raises(BadInputError, match="blend"):
        HotnessForecaster(blend=1.5)


def test_a_grown_booster_forecasts_afresh_not_from_the_last_forecast_kept(moving):
    from models.forecaster import HotnessForecaster

    model = HotnessForecaster(objective="median", n_estimators=5, partial_rounds=5)
    end = moving.n_windows - 10
    model.fit(moving, end)
    items = np.arange(moving.n_items)
    before = model.predict_at(moving, end, items)
    model.partial_fit(moving, moving.n_windows - 2)
    after = model.predict_at(moving, end, items)
    np.testing.assert_allclose(after, model.trees_forecast(moving, end, items, 1))
    assert not np.allclose(before, after)


def test_a_saved_blend_loads_and_predicts_the_same(tmp_path, moving):
    from models.forecaster import HotnessForecaster
    from models.persistence import load_model

    blend = HotnessForecaster(objective="median", n_estimators=10, blend=0.5).fit(moving)
    save_model(blend, tmp_path, "hotness")
    loaded = load_model(tmp_path, "hotness")
    items = np.arange(moving.n_items)
    t = moving.n_windows - 1
    np.testing.assert_allclose(
        loaded.predict_at(moving, t, items), blend.predict_at(moving, t, items)
    )


def _backtest(
    captured: dict[str, list[list[float]]], abs_error: dict[str, list[float]]
) -> Backtest:
    """A backtest of named candidates: ``captured[model][budget]`` per origin, out of 10 a
    budget per origin; ``abs_error[model]`` per origin over 10 items."""
    models = tuple(captured)
    grid = np.array([captured[m] for m in models], dtype=float)
    n_budgets, n_origins = grid.shape[1:]
    return Backtest(
        models=models, budgets=tuple(f"{k} items" for k in range(n_budgets)),
        origins=np.arange(n_origins), captured=grid, oracle=np.full((n_budgets, n_origins), 10.0),
        abs_error=np.array([abs_error[m] for m in models], dtype=float),
        n_scored=np.full(n_origins, 10.0), seconds=0.0,
    )  # fmt: skip


STEADY = [1.0, 1.0, 1.0, 1.0]


def test_a_lead_within_the_noise_goes_to_the_simpler_candidate_and_a_clear_one_wins():
    noisy = [[8, 6, 9, 5], [8, 6, 9, 5]]
    lucky = [[10, 5, 9, 6], [10, 5, 9, 6]]  # +0.5 a window on average, SE 0.65: noise
    clear = [[9, 7, 10, 6], [9, 7, 10, 6]]  # +1 at every origin: no spread at all
    errors = {"ewma": STEADY, "lightgbm_poisson": STEADY}
    within = _backtest({"ewma": noisy, "lightgbm_poisson": lucky}, errors)
    assert choose(within) == "ewma"
    beyond = _backtest({"ewma": noisy, "lightgbm_poisson": clear}, errors)
    assert choose(beyond) == "lightgbm_poisson"


def test_a_candidate_that_loses_to_a_baseline_at_one_budget_is_never_chosen():
    base = [[5, 5, 5, 5], [8, 8, 8, 8]]
    lopsided = [[9, 9, 9, 9], [6, 6, 6, 6]]  # far ahead at the small budget, behind at the big
    table = _backtest({"last_window": base, "lightgbm_poisson": lopsided},
                      {"last_window": STEADY, "lightgbm_poisson": STEADY})  # fmt: skip
    assert shortfall(table, "lightgbm_poisson") > 1
    assert choose(table) == "last_window"
    errors = {"last_window": STEADY, "lightgbm_poisson": [1.5, 1.4, 1.6, 1.5]}
    worse_mae = _backtest({"last_window": base, "lightgbm_poisson": [[6] * 4, [8] * 4]}, errors)
    assert choose(worse_mae) == "last_window"


def test_the_backtest_is_sized_in_origins_and_refits_with_the_last_origin_on_its_own(moving):
    from models.backtest import plan_backtest, run_backtest

    plan = plan_backtest(moving.n_windows - 1, 1, 12, 8, 6, requested=41)
    assert plan is not None and plan.learning and plan.origins == 41
    blocks = plan.blocks()
    assert len(blocks) == 9 and blocks[-1] == (plan.last_t, plan.last_t)  # 8 refits, then the last
    assert [first for first, _ in blocks] == sorted(first for first, _ in blocks)  # oldest first
    covered = [t for first, last in blocks for t in range(first, last + 1)]
    assert covered == list(range(plan.first_t, plan.last_t + 1))
    scored = run_backtest(moving, dict(baselines()), plan, (3,))
    assert list(scored.origins) == covered and scored.cpu_seconds > 0


#: A candidate of each kind: plain (a baseline), blended (of baselines; of LightGBM and the moving
#: average) and tiered.
KINDS = ("ewma", "recency_blend", "lightgbm_median_blend", "tiered_calibrated")


def _scored_predictions(monkeypatch) -> dict[tuple[int, int], np.ndarray]:
    """What every candidate predicted at every origin of the backtests that follow, by
    (id of the candidate, origin): the walk-forward's own record, as it judged them."""
    from pipeline import evaluation

    scored: dict[tuple[int, int], np.ndarray] = {}
    judged = evaluation._predicted

    def record(matrix, model, t, seen, horizon=1):
        predicted = judged(matrix, model, t, seen, horizon)
        scored[id(model), t] = predicted.copy()
        return predicted

    monkeypatch.setattr(evaluation, "_predicted", record)
    return scored


def _assert_ranks_as_scored(selected: SelectedForecaster, matrix: CountMatrix, scored) -> None:
    """The selected model's predictions (so its ranking) at the backtest's last origin are
    the ones its backtest judged there, and so is what they captured at each budget."""
    backtest, t = selected.backtest_, selected.plan_.last_t
    assert backtest.origins[-1] == t
    seen = matrix.seen_by(t)
    predicted = selected.predict_at(matrix, t, seen)
    np.testing.assert_array_equal(predicted, scored[id(selected.winner_), t][seen])
    ranking = seen[np.argsort(-predicted, kind="stable")]
    actual = matrix.requests[:, t + 1]
    captured = backtest.captured[backtest.models.index(selected.winner_name_), :, -1]
    assert [actual[ranking[:k]].sum() for k in selected.budgets] == list(captured)


@pytest.mark.parametrize("name", KINDS)
def test_the_selected_model_ranks_at_the_last_origin_as_its_backtest_scored_it(
    moving, monkeypatch, name
):
    from models.selection import forecaster

    monkeypatch.setattr(forecaster, "choose", lambda backtest: name)  # this kind wins
    scored = _scored_predictions(monkeypatch)
    selected = SelectedForecaster((2, 5), backtest=6, short_history=0).fit(moving, 60)
    assert selected.winner_name_ == name
    _assert_ranks_as_scored(selected, moving, scored)
    if name == "tiered_calibrated":  # the tiers it was scored with, in the report
        assert selected.report()["tiers"] == list(selected.winner_.tiers)


def test_a_short_historys_baseline_tiers_rank_at_the_last_origin_as_scored(moving, monkeypatch):
    scored = _scored_predictions(monkeypatch)
    selected = SelectedForecaster((2, 5)).fit(moving, 30)  # 31 windows: a short history
    assert isinstance(selected.winner_, TieredRanking) and "short history" in selected.note_
    _assert_ranks_as_scored(selected, moving, scored)


def test_the_same_history_gets_the_same_choice_and_table_on_a_loaded_machine(moving):
    def select() -> SelectedForecaster:
        # LightGBM competing on 60 windows, 6 origins: a few seconds, loaded or not.
        return SelectedForecaster((2, 5), backtest=6, short_history=0).fit(moving, 60)

    idle = select()
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(max(2, os.cpu_count() or 2))
    ]  # every core busy while the selection runs
    try:
        busy = select()
        assert all(burner.poll() is None for burner in burners)  # loaded to the end
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    assert idle.plan_.origins == 6 and busy.plan_ == idle.plan_  # the work asked for, both
    assert busy.winner_name_ == idle.winner_name_
    pd.testing.assert_frame_equal(busy.table_, idle.table_)
    timings = ("seconds", "cpu_seconds")
    assert {k: v for k, v in busy.report().items() if k not in timings} == {
        k: v for k, v in idle.report().items() if k not in timings
    }


def test_a_short_history_ranks_as_the_best_baselines_with_calibrated_counts_and_says_so():
    rates = np.geomspace(2, 60, 12)[:, None] * np.ones((1, 30))  # steady tenants, 30 windows
    series = np.random.default_rng(3).poisson(rates).astype(float)
    matrix = CountMatrix.from_counts(counts_from_matrix(series, WINDOW))
    selected = SelectedForecaster((3, 6)).fit(matrix)
    winner = selected.winner_
    assert isinstance(winner, TieredRanking) and winner.calibrated
    assert set(winner.tiers) | {winner.rest} <= set(baselines())
    assert not any(name.startswith("lightgbm") for name in selected.table_["model"])
    assert "short history (30 windows, under 48)" in selected.note_
    assert winner.rest in selected.note_ and "counts calibrated" in selected.note_
    longer = SelectedForecaster((3, 6), short_history=20).fit(matrix)
    assert "short history" not in longer.note_


def test_each_budget_of_a_short_history_is_ranked_by_the_simplest_baseline_within_half_a_point():
    noisy = [8, 10, 8, 9]  # 2.5 points behind at 10 items, within one standard error (4.8)
    errors = {"last_window": STEADY, "moving_average": [2.0] * 4, "ewma": [1.5] * 4}
    table = replace(_backtest({"last_window": [noisy, [5] * 4],
                               "moving_average": [[9, 9, 9, 8.9], [8] * 4],
                               "ewma": [[9] * 4, [9] * 4]}, errors),
                    budgets=("10 items", "20 items"))  # fmt: skip
    deep = {"last_window": 50, "moving_average": 50, "ewma": 50}
    # At 10 items the moving average, 0.25 points behind the EWMA, is the simplest within half
    # a point; the last window's wide noise does not make it one of them.
    assert baseline_tiers(table, (10, 20), deep) == (("moving_average", "ewma"), "last_window")
    # Scoring 15 items above zero, the moving average cannot rank twice 10.
    shallow = {**deep, "moving_average": 15}
    assert baseline_tiers(table, (10, 20), shallow) == (("ewma", "ewma"), "last_window")


def test_the_winner_is_saved_with_its_table_and_loads_to_predict_the_same(tmp_path, moving):
    selected = SelectedForecaster((3,), learning=False).fit(moving)
    save_model(selected.winner_, tmp_path, "hotness", extra=selection_metadata(selected))
    saved = load_selected(tmp_path, "hotness")
    assert saved.winner == selected.winner_name_
    items = np.arange(moving.n_items)
    t = moving.n_windows - 1
    np.testing.assert_allclose(
        saved.model.predict_at(moving, t, items), selected.predict_at(moving, t, items)
    )
    status = saved_selection(tmp_path, "hotness")
    assert status is not None and status["winner"] == selected.winner_name_
    assert {row["model"] for row in status["table"]} == set(selected.table_["model"])
    assert saved_selection(tmp_path, "nothing") is None


def test_a_longer_horizon_predicts_the_window_after_the_downtime(moving):
    counts = counts_from_matrix(_moving_day(), WINDOW)
    selected = SelectedForecaster((3,), horizon=6, learning=False).fit(moving)
    ranking = selected.predict_next(counts, horizon=6)
    assert ranking["window_start"].iloc[0] == moving.window_start(moving.n_windows - 1 + 6)
    assert selected.report()["horizon"] == 6


def test_day_profiles_need_a_day_of_history_and_never_read_ahead():
    series = daily_series(items=4, days=3)
    series[3, : 2 * 144] = 0  # item 3 starts on the last day: less than a day of history
    series[3, 2 * 144 :] += 1
    matrix = CountMatrix.from_counts(counts_from_matrix(series, WINDOW))
    t = 2 * 144 + 100
    hour = FEATURE_NAMES.index("hour_profile")
    rows = features_at(matrix, t, np.arange(4))
    assert np.isfinite(rows[:3, hour]).all() and np.isnan(rows[3, hour])
    later = series.copy()
    later[:, t + 1 :] *= 5
    changed = CountMatrix.from_counts(counts_from_matrix(later, WINDOW))
    np.testing.assert_array_equal(rows, features_at(changed, t, np.arange(4)))


def test_the_planner_uses_the_saved_winner_and_names_it(tmp_path):
    from models.forecaster import SAVED_NAME
    from tasks.services.planning import saved_forecast

    counts = counts_from_matrix(_moving_day(days=2), WINDOW, kind="prefix")
    matrix = CountMatrix.from_counts(counts, kind="prefix")
    selected = SelectedForecaster((3,), learning=False).fit(matrix)
    save_model(selected.winner_, tmp_path, SAVED_NAME, extra=selection_metadata(selected))
    found = saved_forecast(counts, tmp_path)
    assert found is not None
    predicted, note = found
    assert note == f"saved, winner={selected.winner_name_}"
    assert len(predicted) == matrix.n_items


def _budget_shares(names: list[str], per_origin: dict[tuple[str, int], list[float]]) -> Backtest:
    """A backtest of ``names`` at budgets 4 and 8 items over three origins, each with an oracle
    of 1: every name captures 0.5 at each origin, but ``per_origin[name, budget]``."""
    captured = np.array([[per_origin.get((name, b), [0.5] * 3) for b in (4, 8)] for name in names])
    return Backtest(models=tuple(names), budgets=("4 items", "8 items"), origins=np.arange(3),
                    captured=captured, oracle=np.ones((2, 3)),
                    abs_error=np.ones((len(names), 3)), n_scored=np.ones(3),
                    seconds=0.0)  # fmt: skip


def test_with_learners_each_tier_is_ranked_by_its_best_simple_candidate_over_the_wider_span(
    moving,
):
    selected = SelectedForecaster((4, 8))
    selected.daily_ = False
    models = simple_models(daily=False)
    plan = BacktestPlan(first_t=11, last_t=40, refit_every=10, learning=True)
    wide = selected._rankers_backtest(moving, models, plan)
    assert wide.origins[0] == FIRST_TIER_ORIGIN and wide.origins[-1] == plan.last_t
    assert set(wide.models) == set(models)
    scored = run_backtest(moving, models, plan, (4, 8))
    # Ahead of every simpler one at every origin: each budget's best ranks its tier.
    best = {("moving_average", 4): [0.6] * 3, ("ewma_slow", 8): [0.6] * 3}
    tiers = with_tiered(moving, models, scored, plan, selected, _budget_shares([*models], best))
    assert tiers[0]["tiered"].tiers == ("moving_average", "ewma_slow")
    assert tiers[1].models[-2:] == ("tiered", "tiered_calibrated")
    assert list(tiers[1].origins) == list(scored.origins)
    # A simpler one behind on the mean by less than the noise (one standard error of the paired
    # difference across origins): it ranks the tier.
    noisy = {**best, ("last_window", 8): [0.2, 1.0, 0.55]}
    tiers = with_tiered(moving, models, scored, plan, selected, _budget_shares([*models], noisy))
    assert tiers[0]["tiered"].tiers == ("moving_average", "last_window")
    # Without it (a short history): one ranker for every tier, the one the choice keeps.
    tiers = with_tiered(moving, models, scored, plan, selected)
    assert len(set(tiers[0]["tiered"].tiers)) == 1
