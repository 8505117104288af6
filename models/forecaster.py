"""The hotness forecaster: LightGBM with a count objective over sliding-window features.

One training row is ``(item, s)``: the features of the item's windows ``0..s``
(:mod:`models.features`) and, as the label, its requests in window ``s + 1``. Most item-windows
of a prefix trace are inactive (on Mooncake about 97% of the seen blocks get no request in the
next minute), so inactive rows are subsampled and weighted back (weight = 1 / keep rate), which
keeps the Poisson mean calibrated while training stays well under a minute on 2 cores.
"""

from __future__ import annotations

import itertools
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd

from models.baselines import HotnessModel, MovingAverage, _until
from models.features import CATEGORICAL, FEATURE_NAMES, candidates, features_at
from models.model_state import ModelState
from pipeline.errors import BadInputError
from pipeline.evaluation import CountMatrix

#: The name the forecaster is saved under (``<data_dir>/models/<name>``) by the model tasks, and
#: looked up by the planner.
SAVED_NAME = "hotness"


class HotnessForecaster(HotnessModel):
    """Predicts each item's next-window requests.

    ``objective``: ``poisson`` or ``tweedie`` (count objectives; the expected requests, what a
    ranking by hotness wants) or ``median`` (the L1-optimal forecast, what a forecast judged by
    absolute error wants: on bursty tenants that jump between ~0 and ~50,000 requests per
    window the mean and the median differ by half the jump). For ``median`` the trees fit the
    ratio of the next count to the last one, weighted by the last one, which is exactly the
    absolute error of the counts.

    ``train_windows`` limits training to the most recent history ends, ``lookback`` limits the
    candidates to items seen in the last ``lookback`` windows, and at most ``max_rows`` rows
    (inactive ones subsampled to ``negatives_per_positive`` per active one) are trained on.
    ``validation_windows`` > 0 chooses the number of trees walk-forward: a first booster learns
    from all but the latest ``validation_windows`` history ends, stops after ``patience`` rounds
    without a better loss on them, and the final booster learns that many rounds on all of them.
    ``horizon`` is the window predicted: 1 (the next one, default) or more (the first window
    after a downtime of ``horizon - 1`` windows); rows are labelled that many windows ahead.
    ``num_threads`` defaults to 1: on the shared 2-core machine (load ~8) one fit of 150k rows
    took 9 s with one thread and 112 s with two, OpenMP threads spinning against each other.
    ``blend`` > 0 mixes that share of the moving average (:class:`models.baselines.MovingAverage`)
    into the trees' forecast: the trees' shape of the day, the average's level.
    """

    name = "lightgbm"

    def __init__(
        self,
        objective: str = "poisson",
        n_estimators: int = 60,
        learning_rate: float = 0.08,
        num_leaves: int = 31,
        min_child_samples: int = 20,
        tweedie_variance_power: float = 1.2,
        train_windows: int | None = None,
        lookback: int | None = None,
        negatives_per_positive: float = 5.0,
        max_rows: int = 80_000,
        partial_rounds: int = 50,
        max_delta_step: float = 1.0,
        validation_windows: int = 0,
        patience: int = 10,
        num_threads: int = 1,
        random_state: int = 0,
        horizon: int = 1,
        blend: float = 0.0,
    ) -> None:
        if not 0.0 <= blend <= 1.0:
            raise BadInputError(f"must be within 0..1, not {blend}", where="blend")
        self.objective = objective
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.tweedie_variance_power = tweedie_variance_power
        self.train_windows = train_windows
        self.lookback = lookback
        self.negatives_per_positive = negatives_per_positive
        self.max_rows = max_rows
        self.partial_rounds = partial_rounds
        self.max_delta_step = max_delta_step
        self.validation_windows = validation_windows
        self.patience = patience
        self.num_threads = num_threads
        self.random_state = random_state
        self.horizon = horizon
        self.blend = blend
        self._twin: HotnessForecaster | None = None

    def blended(self, share: float) -> HotnessForecaster:
        """The same forecaster with ``share`` of the moving average mixed in, sharing this
        one's booster when both are fitted on the same history (one training for the two)."""
        twin = HotnessForecaster(**{**self.get_params(), "blend": share})
        twin._twin = self
        return twin

    def fit(self, matrix: CountMatrix, until: int | None = None) -> HotnessForecaster:
        """Train a fresh booster on history ends up to ``until - 1``; returns ``self``."""
        end = _until(matrix, until)
        if self._shares_fit(matrix, end):
            return self
        first = 0 if self.train_windows is None else max(0, end - self.train_windows)
        rounds = self._validated_rounds(matrix, first, end)
        data = self._dataset(matrix, first, end)
        self.booster_ = lgb.train(self.lgb_params(), data, num_boost_round=rounds)
        self.n_rounds_ = rounds
        self._record_fit(matrix, first, end, data)
        self.fitted_on_ = _fit_mark(matrix, end)
        return self

    def _shares_fit(self, matrix: CountMatrix, end: int) -> bool:
        """Take the twin's booster when it was just fitted on the same history."""
        twin = self._twin
        fitted_on = getattr(twin, "fitted_on_", None)
        if twin is None or fitted_on is None or fitted_on[1:] != (_matrix_key(matrix), end):
            return False
        for name in ("booster_", "n_rounds_", "window_", "feature_names_", "trained_from_",
                     "trained_until_", "n_training_rows_", "fitted_on_"):  # fmt: skip
            setattr(self, name, getattr(twin, name))
        return True

    def _validated_rounds(self, matrix: CountMatrix, first: int, end: int) -> int:
        """Trees to grow: ``n_estimators``, or fewer when the latest past windows say so."""
        split = end - self.validation_windows
        if self.validation_windows <= 0 or split - first < 1:
            return self.n_estimators
        try:
            train = self._dataset(matrix, first, split)
            valid = self._dataset(matrix, split, end, reference=train)
        except BadInputError:  # no requests on one side: nothing to choose with
            return self.n_estimators
        booster = lgb.train(
            self.lgb_params(),
            train,
            num_boost_round=self.n_estimators,
            valid_sets=[valid],
            callbacks=[lgb.early_stopping(self.patience, verbose=False)],
        )
        return max(1, int(booster.best_iteration or self.n_estimators))

    def partial_fit(self, matrix: CountMatrix, until: int | None = None) -> HotnessForecaster:
        """Add ``partial_rounds`` trees learnt on the windows after the last fit's end."""
        if not hasattr(self, "booster_"):
            return self.fit(matrix, until)
        end = _until(matrix, until)
        first = max(0, int((self.trained_until_ - matrix.start) // matrix.window))
        if first >= end:
            return self
        data = self._dataset(matrix, first, end)
        self.booster_ = lgb.train(
            self.lgb_params(),
            data,
            num_boost_round=self.partial_rounds,
            init_model=self.booster_,
            keep_training_booster=True,
        )
        self._record_fit(matrix, first, end, data)
        self.fitted_on_ = _fit_mark()  # grown, not fitted: no twin shares it
        return self

    def lgb_params(self) -> dict[str, Any]:
        """LightGBM parameters derived from the constructor's."""
        params: dict[str, Any] = {
            "objective": self.objective,
            "learning_rate": self.learning_rate,
            "num_leaves": self.num_leaves,
            "min_data_in_leaf": self.min_child_samples,
            "feature_fraction": 0.9,
            # Bounds each tree's step in log space: with a small offset and a label of 200k
            # requests (ServeGen) one Poisson leaf otherwise jumps by ~1e5 and overflows exp().
            "max_delta_step": self.max_delta_step,
            "num_threads": self.num_threads,
            "seed": self.random_state,
            "deterministic": True,
            "verbose": -1,
        }
        if self.objective == "tweedie":
            params["tweedie_variance_power"] = self.tweedie_variance_power
        elif self.objective == "median":
            params["objective"] = "l1"
        elif self.objective != "poisson":
            raise BadInputError("must be 'poisson', 'tweedie' or 'median'", where="objective")
        return params

    def feature_importance(self) -> dict[str, float]:
        """Total gain per feature of the fitted booster."""
        self._check_fitted()
        gains = self.booster_.feature_importance(importance_type="gain")
        return dict(zip(self.feature_names_, map(float, gains), strict=True))

    def feature_names(self) -> list[str]:
        """The features this code computes (a saved booster must have been trained on them)."""
        return list(FEATURE_NAMES)

    def export_state(self) -> ModelState:
        """Booster as LightGBM text plus the training range, for :mod:`models.persistence`."""
        state = super().export_state()
        state.values["trained_from"] = self.trained_from_.isoformat()
        state.values["n_training_rows"] = self.n_training_rows_
        state.texts["booster"] = self.booster_.model_to_string()
        return state

    def import_state(self, state: ModelState) -> HotnessForecaster:
        """Restore a booster saved by :meth:`export_state`; returns ``self``."""
        super().import_state(state)
        self.trained_from_ = pd.Timestamp(state.values["trained_from"])
        self.n_training_rows_ = int(state.values["n_training_rows"])
        self.feature_names_ = FEATURE_NAMES
        self.booster_ = lgb.Booster(model_str=state.texts["booster"])
        self.fitted_on_ = _fit_mark()
        return self

    def _predict(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray:
        if horizon != self.horizon:
            raise BadInputError(
                f"the model predicts {self.horizon} window(s) ahead, asked for {horizon}",
                where="horizon",
            )
        trees = _TREES.get(self, matrix, t, items, horizon)
        if not self.blend:
            return trees
        average = MovingAverage()._predict(matrix, t, items, horizon)
        return (1.0 - self.blend) * trees + self.blend * average

    def trees_forecast(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int
    ) -> np.ndarray:
        """The booster's own forecast of ``items`` at history end ``t``."""
        rows = features_at(matrix, t, items, horizon)
        raw = self.booster_.predict(rows, raw_score=True, num_threads=self.num_threads)
        if self.objective == "median":
            return np.maximum(1.0 + np.asarray(raw), 0.0) * last_level(rows)
        correction = np.clip(np.asarray(raw), -MAX_LOG_CORRECTION, MAX_LOG_CORRECTION)
        return np.exp(correction + base_margin(rows))

    def _record_fit(self, matrix: CountMatrix, first: int, end: int, data: lgb.Dataset) -> None:
        self.window_ = matrix.window
        self.feature_names_ = FEATURE_NAMES
        self.trained_from_ = matrix.window_start(first)
        self.trained_until_ = matrix.window_start(end)
        self.n_training_rows_ = int(data.num_data())

    def _dataset(
        self, matrix: CountMatrix, first: int, end: int, reference: lgb.Dataset | None = None
    ) -> lgb.Dataset:
        if end - first < self.horizon:
            raise BadInputError("needs at least two windows of history to learn", where="counts")
        rng = np.random.default_rng(self.random_state)
        ends = range(first, end - self.horizon + 1)
        picks = [self._pick_rows(matrix, s, rng) for s in ends]
        keep = _cap_rows(picks, self.max_rows, rng)
        blocks = [
            (features_at(matrix, s, it, self.horizon), y, w) for s, it, y, w in keep if len(it)
        ]
        if not blocks or sum(float(y.sum()) for _, y, _ in blocks) <= 0:
            raise BadInputError("no requests in the training windows", where="counts")
        features, labels, weights = (np.concatenate(part) for part in zip(*blocks, strict=True))
        if self.objective == "median":
            level = last_level(features)
            labels, weights, start = labels / level, weights * level, np.ones(len(labels))
        else:
            start = base_margin(features)
        return lgb.Dataset(
            features,
            label=labels,
            weight=weights,
            init_score=start,
            feature_name=list(FEATURE_NAMES),
            categorical_feature=list(CATEGORICAL),
            free_raw_data=True,
            reference=reference,
        )

    def _pick_rows(self, matrix: CountMatrix, s: int, rng: np.random.Generator) -> _Rows:
        items = candidates(matrix, s, self.lookback)
        labels = matrix.requests[items, s + self.horizon]
        active = labels > 0
        n_active, n_idle = int(active.sum()), int((~active).sum())
        wanted = max(self.negatives_per_positive * max(n_active, 1), 50.0)
        rate = min(1.0, wanted / max(n_idle, 1))
        keep = active | (rng.random(len(items)) < rate)
        weights = np.where(active, 1.0, 1.0 / rate)[keep].astype(np.float32)
        return s, items[keep], labels[keep], weights


class _LastTreesForecast:
    """The latest booster forecast, kept for a twin that asks for the same one next (a
    backtest judges a forecaster and its blend on the same history ends)."""

    def __init__(self) -> None:
        self.key: tuple[Any, ...] | None = None
        self.value: np.ndarray | None = None

    def get(self, model: HotnessForecaster, matrix: CountMatrix, t: int, items: np.ndarray,
            horizon: int) -> np.ndarray:  # fmt: skip
        key = (
            model.fitted_on_[0],
            _matrix_key(matrix),
            t,
            horizon,
            len(items),
            hash(items.tobytes()),
        )
        if key != self.key or self.value is None:
            self.value = model.trees_forecast(matrix, t, items, horizon)
            self.key = key
        return self.value


def _matrix_key(matrix: CountMatrix) -> tuple[int, int, int]:
    return id(matrix), matrix.n_items, matrix.n_windows


def _fit_mark(
    matrix: CountMatrix | None = None, end: int | None = None
) -> tuple[int, tuple[int, int, int] | None, int | None]:
    """A booster's identity (a fresh number per booster) and, for a fit a twin may share, the
    history it was fitted on."""
    return next(_FITS), (_matrix_key(matrix) if matrix is not None else None), end


_TREES = _LastTreesForecast()
_FITS = itertools.count()
_Rows = tuple[int, np.ndarray, np.ndarray, np.ndarray]
_EWMA = FEATURE_NAMES.index("ewma_fast")
_LAST = FEATURE_NAMES.index("lag_0")
#: Expected requests of an item with no recent history before the trees adjust it.
MARGIN_FLOOR = 0.05
#: Guard on the trees' total correction of the offset, in log space (e^12 ~ 160,000x).
MAX_LOG_CORRECTION = 12.0


def last_level(features: np.ndarray) -> np.ndarray:
    """Each row's last-window count plus a floor: the reference of the ``median`` objective.

    Persistence is the strongest absolute-error baseline on bursty tenants (ServeGen), so the
    trees learn when to move away from it.
    """
    return features[:, _LAST].astype(np.float64) + MARGIN_FLOOR


def item_level(features: np.ndarray) -> np.ndarray:
    """Each row's level: its fast EWMA plus a floor (the scale of its forecast)."""
    return features[:, _EWMA].astype(np.float64) + MARGIN_FLOOR


def base_margin(features: np.ndarray) -> np.ndarray:
    """Log of the fast EWMA: the trees learn a multiplicative correction of it.

    Boosting from a per-item level instead of one global mean keeps Poisson stable on
    heavy-tailed counts (one Mooncake block gets ~1,000 requests per 5 minutes, most get 0 or
    1; without the offset a few leaves mixing both blew predictions up to 1e24) and lets one
    model serve tenants whose volumes differ by orders of magnitude.
    """
    return np.log(item_level(features))


def _cap_rows(picks: list[_Rows], max_rows: int, rng: np.random.Generator) -> list[_Rows]:
    """Uniformly thin every window's rows so that at most ``max_rows`` remain (weights kept)."""
    total = sum(len(items) for _, items, _, _ in picks)
    if total <= max_rows:
        return picks
    rate = max_rows / total
    thinned = []
    for s, items, labels, weights in picks:
        keep = rng.random(len(items)) < rate
        thinned.append((s, items[keep], labels[keep], weights[keep]))
    return thinned
