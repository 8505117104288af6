"""A ranking per budget with calibrated counts: the simple candidate for when baselines disagree.

The share a plan keeps at a budget of ``K`` items depends only on which ``K`` items rank first,
and the MAE only on the predicted counts. On bursty prefix traces the simple rankers disagree by
budget — the last window orders the hottest few best (a burst now is a burst next window), the
EWMA the next hundreds (a session's blocks come back a few windows later) — and every one of
them predicts counts far from what a window sees: most seen blocks get no request next window.
:class:`TieredRanking` keeps each ranking where it is good and calibrates the counts:

* ranking: one simple model (:func:`models.baselines.simple_models`) per item budget, its
  ``tiers`` (the selection names them from its backtest, :func:`tier_rankers`):
  the smallest budget's top items come from its ranker, the next budget's tier is filled from
  its ranker with the items not already taken, and so on; the items after the largest budget
  keep that budget's ranker's order;
* counts: each tier's ranker score is mapped to the median count ``horizon`` windows later of
  the seen items with similar scores on the latest ``windows`` history ends (bucket medians
  made monotone by isotonic regression: the map keeps the ranker's order), then kept
  non-increasing along the tiered order, so the counts rank exactly as the tiers do."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.isotonic import IsotonicRegression

from models.backtest import Backtest
from models.baselines import HotnessModel, _until, simple_models
from models.model_state import ModelState
from pipeline.errors import BadInputError
from pipeline.evaluation import CountMatrix

#: Score buckets of the count calibration, and the most (score, count) pairs it fits on.
BUCKETS, MAX_PAIRS = 100, 200_000
#: Keeps the tiered order among equal calibrated counts (a share of the top count).
ORDER_STEP = 1e-9


class TieredRanking(HotnessModel):
    """Ranks each item budget's tier by its own simple model (``tiers``: their names, one per
    budget, smallest budget first) and predicts calibrated counts; see the module docstring.

    ``windows``: the history ends the counts are calibrated on; ``daily``: the day-aware
    models may rank too; ``horizon``: the window ahead the counts are calibrated to.
    """

    name = "tiered"

    def __init__(
        self, budgets: tuple[int, ...] = (100,), tiers: tuple[str, ...] = ("last_window",),
        rest: str | None = None, calibrated: bool = True, windows: int = 12,
        daily: bool = False, horizon: int = 1,
    ) -> None:  # fmt: skip
        if len(budgets) != len(tiers) or not budgets:
            raise BadInputError(f"one ranker per budget: {tiers} for {budgets}", where="tiers")
        unknown = {*tiers, rest or tiers[0]} - set(simple_models(daily))
        if unknown:
            raise BadInputError(f"not a simple model: {', '.join(sorted(unknown))}", where="tiers")
        ranked = sorted(zip(budgets, tiers, strict=True))
        self.budgets = tuple(int(b) for b, _ in ranked)
        self.tiers = tuple(name for _, name in ranked)
        self.rest = rest or self.tiers[-1]
        self.calibrated = calibrated
        self.windows = windows
        self.daily = daily
        self.horizon = horizon

    def fit(self, matrix: CountMatrix, until: int | None = None) -> TieredRanking:
        """Calibrate each ranker's counts on the latest history ends up to ``until``."""
        super().fit(matrix, until)
        end = _until(matrix, until) - self.horizon
        ends = list(range(max(0, end - self.windows + 1), end + 1)) if self.calibrated else []
        self.rankers_ = self._fresh_rankers()
        self.maps_ = {name: _calibration(matrix, ranker, ends, self.horizon)
                      for name, ranker in self.rankers_.items()}  # fmt: skip
        return self

    def _fresh_rankers(self) -> dict[str, HotnessModel]:
        """The tiers' and the rest's rankers, one instance each (kept: some cache per matrix)."""
        models = simple_models(self.daily)
        return {name: models[name] for name in dict.fromkeys([*self.tiers, self.rest])}

    def _predict(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray:
        scores = {name: _scores(ranker, matrix, t, items, horizon)
                  for name, ranker in self.rankers_.items()}  # fmt: skip
        names = [*self.tiers, self.rest]
        order = _tiered_order([scores[name] for name in names], self.budgets)
        counts = np.zeros(len(items))
        for name, (first, last) in zip(names, _tier_bounds(self.budgets, len(items)),
                                       strict=True):  # fmt: skip
            tier = order[first:last]
            counts[tier] = _counts(scores[name][tier], self.maps_[name])
        ranked = np.minimum.accumulate(counts[order])
        # Equal counts would rank by position: a step far below any count keeps the order.
        step = ORDER_STEP * max(float(ranked[0]), 1.0) if len(ranked) else 0.0
        counts[order] = ranked + step * np.arange(len(order), 0, -1) / max(len(order), 1)
        return counts

    def export_state(self) -> ModelState:
        """The tiers' rankers and their calibrations, for :mod:`models.persistence`."""
        state = super().export_state()
        for name, calibration in self.maps_.items():
            if calibration is not None:
                state.arrays[f"{name}.scores"], state.arrays[f"{name}.counts"] = calibration
        return state

    def import_state(self, state: ModelState) -> TieredRanking:
        """Restore what :meth:`export_state` saved; returns ``self``."""
        super().import_state(state)
        self.rankers_ = self._fresh_rankers()
        self.maps_ = {name: (state.arrays[f"{name}.scores"], state.arrays[f"{name}.counts"])
                      if self.calibrated else None for name in self.rankers_}  # fmt: skip
        return self

    def get_params(self) -> dict[str, Any]:
        """Constructor parameters (as JSON values)."""
        return {**super().get_params(), "budgets": list(self.budgets), "tiers": list(self.tiers)}


def tier_rankers(
    backtest: Backtest,
    names: list[str],
    budgets: tuple[int, ...],
    tolerance: float,
    noise_ses: float = 0.0,
) -> tuple[str, ...]:
    """The ranker of each item budget's tier: of the simple candidates ``names`` (simplest
    first), the simplest whose backtest share at that budget is within ``tolerance`` of the
    best one's, or (``noise_ses``) within that many standard errors of their paired
    difference across origins: the one-standard-error rule."""
    tiers = []
    for budget in budgets:
        i = backtest.budgets.index(f"{budget} items")
        shares = {name: float(backtest.share(name)[i]) for name in names}
        best = max(shares, key=shares.__getitem__)
        slack = {name: max(tolerance, noise_ses * float(backtest.share_noise(name, best)[i]))
                 if noise_ses and name != best else tolerance for name in names}  # fmt: skip
        tiers.append(next(name for name in names if shares[name] >= shares[best] - slack[name]))
    return tuple(tiers)


def _scores(
    model: HotnessModel, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int
) -> np.ndarray:
    """A simple model's forecast (stateless: nothing of its own to fit first)."""
    return np.maximum(model._predict(matrix, t, items, horizon), 0.0)


def _counts(scores: np.ndarray, calibration: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """Counts of a ranker's scores: calibrated, or the scores themselves without a map."""
    return scores if calibration is None else np.interp(scores, *calibration)


def _calibration(
    matrix: CountMatrix, model: HotnessModel, ends: list[int], horizon: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """The map from ``model``'s score to the median count ``horizon`` windows later: bucket
    medians of the seen items' (score, count) pairs at ``ends``, made non-decreasing (``None``
    without ``ends``: the scores are the counts)."""
    if not ends:
        return None
    scores, counts = [], []
    for s in ends:
        seen = matrix.seen_by(s)
        scores.append(_scores(model, matrix, s, seen, horizon))
        counts.append(matrix.requests[seen, s + horizon].astype(np.float64))
    x, y = np.concatenate([np.zeros(0), *scores]), np.concatenate([np.zeros(0), *counts])
    if len(x) == 0:  # nothing seen yet: every count 0
        return np.zeros(1), np.zeros(1)
    if len(x) > MAX_PAIRS:
        keep = np.random.default_rng(0).choice(len(x), MAX_PAIRS, replace=False)
        x, y = x[keep], y[keep]
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    edges = np.unique(np.quantile(x, np.linspace(0.0, 1.0, BUCKETS + 1)))
    bucket = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 1)
    starts = np.flatnonzero(np.diff(bucket, prepend=-1))
    centres = np.add.reduceat(x, starts) / np.diff(np.append(starts, len(x)))
    medians = np.array([np.median(part) for part in np.split(y, starts[1:])])
    weights = np.diff(np.append(starts, len(x))).astype(np.float64)
    fitted = IsotonicRegression(increasing=True).fit(centres, medians, sample_weight=weights)
    return centres, fitted.predict(centres)


def _tier_bounds(budgets: tuple[int, ...], n: int) -> list[tuple[int, int]]:
    """(first, last) position of each budget's tier in the tiered order, and of the rest."""
    cuts = [*(min(b, n) for b in budgets), n]
    return list(zip([0, *cuts[:-1]], cuts, strict=True))


def _tiered_order(scores: list[np.ndarray], budgets: tuple[int, ...]) -> np.ndarray:
    """Positions of the items best first: each budget's tier (and then the rest) filled from
    its own scores' order with the items not already taken."""
    n = len(scores[0])
    taken = np.zeros(n, dtype=bool)
    order: list[np.ndarray] = []
    for own, (first, last) in zip(scores, _tier_bounds(budgets, n), strict=True):
        ranked = np.argsort(-own, kind="stable")
        fresh = ranked[~taken[ranked]][: last - first]
        taken[fresh] = True
        order.append(fresh)
    return np.concatenate(order)
