"""The tiered ranking: each budget's top items from its own ranker, calibrated counts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from models.backtest import Backtest
from models.baselines import EWMA, LastWindow
from models.persistence import load_model, save_model
from models.selection import SHARE_TOLERANCE
from models.tiered import TieredRanking, tier_rankers
from pipeline.errors import BadInputError
from pipeline.evaluation import CountMatrix
from tests.unit.models.series import counts_from_matrix

WINDOW = pd.Timedelta(minutes=1)


def _bursty(items: int = 60, windows: int = 40, seed: int = 3) -> np.ndarray:
    """Items at steady rates, each bursting (10x) in a few random windows and idle in most:
    the last window and the EWMA rank them differently."""
    rng = np.random.default_rng(seed)
    rate = rng.uniform(0.2, 4.0, size=(items, 1)) * np.ones((1, windows))
    rate *= np.where(rng.random((items, windows)) < 0.08, 10.0, 1.0)
    return rng.poisson(rate).astype(float)


@pytest.fixture(scope="module")
def bursty() -> CountMatrix:
    return CountMatrix.from_counts(counts_from_matrix(_bursty(), WINDOW))


def _top(scores: np.ndarray, k: int) -> set[int]:
    return set(np.argsort(-scores, kind="stable")[:k].tolist())


def test_each_budget_takes_its_top_items_from_its_own_ranker(bursty):
    t = bursty.n_windows - 2
    items = bursty.seen_by(t)
    model = TieredRanking((5, 20), ("last_window", "ewma")).fit(bursty, t)
    predicted = model.predict_at(bursty, t, items)
    last = LastWindow().fit(bursty, t).predict_at(bursty, t, items)
    smooth = EWMA().fit(bursty, t).predict_at(bursty, t, items)
    assert _top(predicted, 5) == _top(last, 5)
    rest = [i for i in np.argsort(-smooth, kind="stable") if i not in _top(last, 5)]
    assert _top(predicted, 20) == _top(last, 5) | set(rest[:15])
    assert _top(last, 20) != _top(smooth, 20)  # the two rankers do disagree here


def test_calibrated_counts_are_the_median_a_score_sees_next_window():
    # Every item is active in one window out of four: the last window predicts its count, the
    # window after is idle three times in four, so the median next count is 0.
    windows = 48
    counts = np.zeros((30, windows))
    for i in range(30):
        counts[i, (np.arange(windows) + i) % 4 == 0] = 5 + i % 3
    matrix = CountMatrix.from_counts(counts_from_matrix(counts, WINDOW))
    t = windows - 2
    items = matrix.seen_by(t)
    raw = TieredRanking((5,), ("last_window",), calibrated=False).fit(matrix, t)
    calibrated = TieredRanking((5,), ("last_window",)).fit(matrix, t)
    actual = matrix.requests[items, t + 1]
    raw_error = np.abs(raw.predict_at(matrix, t, items) - actual).mean()
    calibrated_error = np.abs(calibrated.predict_at(matrix, t, items) - actual).mean()
    assert calibrated_error < raw_error
    assert np.allclose(calibrated.predict_at(matrix, t, items), 0.0, atol=1e-6)


def test_counts_rank_the_tiers_in_order_and_are_never_negative(bursty):
    t = bursty.n_windows - 2
    items = bursty.seen_by(t)
    model = TieredRanking((5, 20), ("last_window", "ewma"), rest="moving_average").fit(bursty, t)
    predicted = model.predict_at(bursty, t, items)
    assert (predicted >= 0).all()
    assert len(np.unique(predicted)) == len(predicted)  # no ties: the order is the tiers'


def test_a_saved_tiered_ranking_loads_and_predicts_the_same(tmp_path, bursty):
    model = TieredRanking((5, 20), ("last_window", "ewma")).fit(bursty)
    save_model(model, tmp_path, "hotness")
    loaded = load_model(tmp_path, "hotness")
    t = bursty.n_windows - 1
    items = np.arange(bursty.n_items)
    np.testing.assert_allclose(
        loaded.predict_at(bursty, t, items), model.predict_at(bursty, t, items)
    )


def test_a_tier_needs_a_simple_ranker_per_budget():
    with pytest.raises(BadInputError, match="one ranker per budget"):
        TieredRanking((5, 20), ("last_window",))
    with pytest.raises(BadInputError, match="not a simple model"):
        TieredRanking((5,), ("lightgbm_median",))


def _shares(shares: dict[str, list[float]]) -> Backtest:
    """A backtest of one origin: ``shares[model][budget]`` of an oracle of 1 (budgets 5, 20)."""
    models = tuple(shares)
    captured = np.array([[[v] for v in shares[m]] for m in models])
    return Backtest(models=models, budgets=("5 items", "20 items"), origins=np.arange(1),
                    captured=captured, oracle=np.ones((2, 1)), abs_error=np.ones((len(models), 1)),
                    n_scored=np.ones(1), seconds=0.0)  # fmt: skip


def test_a_tier_goes_to_the_simplest_ranker_within_the_tolerance_of_the_best():
    scored = _shares({"last_window": [0.900, 0.700], "ewma": [0.903, 0.750],
                      "frequency": [0.950, 0.751]})  # fmt: skip
    assert tier_rankers(scored, ["last_window", "ewma"], (5, 20), SHARE_TOLERANCE) == (
        "last_window",
        "ewma",
    )
    names = ["last_window", "ewma", "frequency"]
    assert tier_rankers(scored, names, (5, 20), SHARE_TOLERANCE) == ("frequency", "ewma")


def test_backtests_of_the_same_origins_join_in_place():
    first = _shares({"last_window": [0.9, 0.7], "lightgbm_median": [0.8, 0.8]})
    second = _shares({"tiered": [0.95, 0.75]})
    joined = first.joined(second, 1)
    assert joined.models == ("last_window", "tiered", "lightgbm_median")
    np.testing.assert_allclose(joined.share("tiered"), [0.95, 0.75])
    np.testing.assert_allclose(joined.share("lightgbm_median"), [0.8, 0.8])
    later = Backtest(**{**vars(second), "origins": np.arange(1) + 1})
    with pytest.raises(ValueError, match="different origins"):
        first.joined(later, 1)


def test_a_ranker_behind_the_best_by_less_than_the_noise_keeps_the_tier_when_simpler():
    def backtest(last_window: list[float]) -> Backtest:
        captured = np.array([[last_window, last_window], [[0.6] * 3, [0.6] * 3]])
        return Backtest(models=("last_window", "ewma"), budgets=("5 items", "20 items"),
                        origins=np.arange(3), captured=captured, oracle=np.ones((2, 3)),
                        abs_error=np.ones((2, 3)), n_scored=np.ones(3),
                        seconds=0.0)  # fmt: skip

    names, budgets = ["last_window", "ewma"], (5, 20)
    noisy, steady = backtest([0.2, 1.0, 0.45]), backtest([0.55] * 3)
    # behind by 0.05 on the mean, all over the place across origins: within one standard error
    assert tier_rankers(noisy, names, budgets, 0.0, 1.0) == ("last_window", "last_window")
    # behind by 0.05 at every origin: no noise to hide in
    assert tier_rankers(steady, names, budgets, 0.0, 1.0) == ("ewma", "ewma")
    # without the rule, only the tolerance counts
    assert tier_rankers(noisy, names, budgets, 0.0) == ("ewma", "ewma")
