"""The hotness model interface and the simple baselines every forecaster must beat.

A hotness model predicts each item's requests in the next window from the windows before it.
All models share one interface (scikit-learn style): ``fit``/``partial_fit`` learn from windows
``0..until`` of a :class:`CountMatrix` and return ``self``; ``predict_at`` scores items at a
history end ``t``; ``predict_next`` takes a counts table and returns the next window's ranking,
which is what the warm-up planner reads.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from models.features import EWMA_FAST, candidates, ewma, running_tables, windows_per_day
from models.model_state import ModelState
from pipeline.errors import BadInputError, PrewarmError
from pipeline.evaluation import CountMatrix, latest_windows_that_fit
from pipeline.shared_prefixes import FREQUENCY_ALPHA

PREDICTION_COLUMNS = ("item_kind", "item_key", "window_start", "predicted")


class ModelNotFittedError(PrewarmError):
    """A model was asked to predict (or be saved) before it was fitted."""


class HotnessModel(ABC):
    """Predicts next-window requests per item; subclasses implement :meth:`_predict`."""

    name: ClassVar[str] = "model"

    def fit(self, matrix: CountMatrix, until: int | None = None) -> HotnessModel:
        """Learn from windows ``0..until`` (default: all); returns ``self``."""
        self.window_ = matrix.window
        self.trained_until_ = matrix.window_start(_until(matrix, until))
        return self

    def partial_fit(self, matrix: CountMatrix, until: int | None = None) -> HotnessModel:
        """Update with newer windows; for stateless baselines the same as :meth:`fit`."""
        return self.fit(matrix, until)

    def predict_at(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray:
        """Predicted requests of ``items`` in window ``t + horizon`` (default: the next one),
        from windows ``0..t`` only."""
        self._check_fitted()
        if horizon < 1:
            raise BadInputError(f"horizon must be at least 1, not {horizon}", where="horizon")
        if len(items) == 0:
            return np.zeros(0)
        return np.maximum(self._predict(matrix, t, np.asarray(items), horizon), 0.0)

    def predict_next(
        self,
        counts: pd.DataFrame,
        kind: str | None = None,
        lookback: int | None = None,
        horizon: int = 1,
    ) -> pd.DataFrame:
        """Next-window hotness of every item seen in ``counts``, hottest first.

        Returns columns ``item_kind, item_key, window_start`` (the predicted window) and
        ``predicted`` (expected requests). ``lookback`` limits candidates to items seen in the
        last ``lookback`` windows; ``horizon`` > 1 predicts that many windows after the
        table's last (a restart after a downtime). A history whose items times windows
        outgrow a matrix is read in its latest windows that fit (``latest_windows_that_fit``).
        """
        self._check_fitted()
        latest, _ = latest_windows_that_fit(counts, kind)  # a busy fleet's history: its latest
        single = latest["window_start"].nunique() < 2
        matrix = CountMatrix.from_counts(latest, window=self.window_ if single else None, kind=kind)
        if matrix.window != self.window_:
            raise BadInputError(
                f"counts have {matrix.window} windows, the model was fitted on {self.window_}",
                where="counts.window_start",
            )
        t = matrix.n_windows - 1
        items = candidates(matrix, t, lookback)
        frame = matrix.items.iloc[items].reset_index(drop=True)
        frame["window_start"] = matrix.window_start(t + horizon)
        frame["predicted"] = self.predict_at(matrix, t, items, horizon)
        return frame.sort_values("predicted", ascending=False, kind="stable").reset_index(drop=True)

    def get_params(self) -> dict[str, Any]:
        """Constructor parameters (what persistence stores to rebuild the model)."""
        return _params(self)

    def feature_names(self) -> list[str]:
        """Names of the features the model reads (none for a baseline)."""
        return []

    def training_range(self) -> tuple[str | None, str | None]:
        """First and last window start of the training data (ISO 8601)."""
        self._check_fitted()
        start = getattr(self, "trained_from_", None)
        return (start.isoformat() if start is not None else None, self.trained_until_.isoformat())

    def export_state(self) -> ModelState:
        """Learned state for :mod:`models.persistence`."""
        self._check_fitted()
        return ModelState(
            values={
                "window_s": self.window_.total_seconds(),
                "trained_until": self.trained_until_.isoformat(),
            }
        )

    def import_state(self, state: ModelState) -> HotnessModel:
        """Restore learned state exported by :meth:`export_state`; returns ``self``."""
        self.window_ = pd.Timedelta(seconds=state.values["window_s"])
        self.trained_until_ = pd.Timestamp(state.values["trained_until"])
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "window_"):
            raise ModelNotFittedError(f"{type(self).__name__} must be fitted before predicting")

    @abstractmethod
    def _predict(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray: ...


def _params(model: object) -> dict[str, Any]:
    return {k: v for k, v in vars(model).items() if not k.endswith("_") and not k.startswith("_")}


def _until(matrix: CountMatrix, until: int | None) -> int:
    last = matrix.n_windows - 1
    if until is None:
        return last
    if not 0 <= until <= last:
        raise BadInputError(f"until={until} outside windows 0..{last}", where="until")
    return until


class LastWindow(HotnessModel):
    """Next window = this window."""

    name = "last_window"

    def _predict(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray:
        return matrix.requests[items, t].astype(np.float64)


class MovingAverage(HotnessModel):
    """Next window = mean of the last ``windows`` windows."""

    name = "moving_average"

    def __init__(self, windows: int = 6) -> None:
        self.windows = windows

    def _predict(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray:
        lo = max(0, t - self.windows + 1)
        return matrix.requests[items, lo : t + 1].mean(axis=1, dtype=np.float64)


class EWMA(HotnessModel):
    """Next window = exponentially weighted mean (weight ``alpha`` on the latest window)."""

    name = "ewma"

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha

    def _predict(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray:
        if self.alpha == EWMA_FAST:  # the features' running table: computed once per matrix
            return running_tables(matrix).ewma_fast[items, t].astype(np.float64)
        # Weights older than ~1% of the newest are dropped: same ranking, bounded cost.
        span = max(1, math.ceil(math.log(0.01) / math.log(1 - self.alpha))) if self.alpha < 1 else 1
        lo = max(0, t - span + 1)
        return ewma(matrix.requests[items, lo : t + 1], self.alpha)[:, -1].astype(np.float64)


class FrequencyEstimate(HotnessModel):
    """Next window = the planner's frequency estimate: the EWMA (weight ``alpha`` on the latest
    window, from the history's first window) averaged with the whole history's mean rate.

    This is the estimate a plan falls back to without a learned forecast
    (:func:`pipeline.shared_prefixes.frequency_hits`, over the history's span), here as a model
    the backtest scores like any other, so a plan on it is measured too.
    """

    name = "frequency"

    def __init__(self, alpha: float = FREQUENCY_ALPHA) -> None:
        self.alpha = alpha

    def _predict(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray:
        table = getattr(self, "_smoothed", None)
        if table is None or table[0] is not matrix.requests:
            table = (matrix.requests, ewma(matrix.requests, self.alpha))
            self._smoothed = table  # one pass per matrix: a backtest predicts at every origin
        rate = running_tables(matrix).cum_requests[items, t].astype(np.float64) / (t + 1)
        return 0.5 * table[1][items, t].astype(np.float64) + 0.5 * rate


class SeasonalNaive(HotnessModel):
    """Next window = the same window one period (default: one day) earlier.

    Before a full period of history exists (or when the target is a period or more past the
    history), falls back to the last window.
    """

    name = "seasonal_naive"

    def __init__(self, period: int | None = None) -> None:
        self.period = period

    def _predict(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray:
        period = self.period or windows_per_day(matrix.window)
        source = t + horizon - period if period else -1
        column = source if 0 <= source <= t else t
        return matrix.requests[items, column].astype(np.float64)


def same_window_days_ago(
    matrix: CountMatrix, t: int, items: np.ndarray, horizon: int, days: int
) -> np.ndarray | None:
    """Mean requests of ``items`` in the target window's slot on the last ``days`` days seen
    (``None`` without a full day of history or a window that divides a day)."""
    period = windows_per_day(matrix.window)
    if period is None:
        return None
    target = t + horizon
    days_ago = (target - d * period for d in range(1, days + 1))
    columns = np.array([c for c in days_ago if 0 <= c <= t], dtype=np.int64)
    if len(columns) == 0:
        return None
    return matrix.requests[np.ix_(items, columns)].mean(axis=1, dtype=np.float64)


class RecencyBlend(HotnessModel):
    """Next window = ``weight`` x the last window + (1 - ``weight``) x the EWMA.

    Between the two strongest baselines: the last window has the lowest absolute error on
    bursty tenants, the EWMA the best top-K; a blend often keeps most of both.
    """

    name = "recency_blend"

    def __init__(self, weight: float = 0.7, alpha: float = 0.3) -> None:
        self.weight = weight
        self.alpha = alpha

    def _predict(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray:
        last = matrix.requests[items, t].astype(np.float64)
        smooth = EWMA(self.alpha)._predict(matrix, t, items, horizon)
        return self.weight * last + (1 - self.weight) * smooth


class DailyBlend(HotnessModel):
    """Next window = ``weight`` x the EWMA + (1 - ``weight``) x the mean of the same window on
    the last ``days`` days: recency plus the day's shape. The EWMA alone before a day of
    history."""

    name = "daily_blend"

    def __init__(self, weight: float = 0.5, days: int = 1, alpha: float = 0.3) -> None:
        self.weight = weight
        self.days = days
        self.alpha = alpha

    def _predict(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray:
        smooth = EWMA(self.alpha)._predict(matrix, t, items, horizon)
        seasonal = same_window_days_ago(matrix, t, items, horizon, self.days)
        if seasonal is None:
            return smooth
        return self.weight * smooth + (1 - self.weight) * seasonal


def baselines() -> dict[str, HotnessModel]:
    """One fresh instance of each baseline, by name (the models a forecaster must not lose to;
    the blends are candidates of :mod:`models.selection`, not baselines)."""
    models: list[HotnessModel] = [
        LastWindow(),
        MovingAverage(),
        EWMA(),
        FrequencyEstimate(),
        SeasonalNaive(),
    ]
    return {model.name: model for model in models}


def simple_models(daily: bool = True) -> dict[str, HotnessModel]:
    """The baselines, a slower EWMA (``ewma_slow``: a conversation's blocks come back minutes
    apart, over several 1-minute windows) and the blends by name, simplest first, as the
    selection scores them; ``daily``: with the day-aware ones (before a day of history they
    equal the last window and the EWMA)."""
    models: dict[str, HotnessModel] = {
        "last_window": LastWindow(),
        "moving_average": MovingAverage(),
        "ewma": EWMA(),
        "ewma_slow": EWMA(0.15),
        "frequency": FrequencyEstimate(),
        "recency_blend": RecencyBlend(weight=0.7),
        "recency_blend_0.9": RecencyBlend(weight=0.9),
    }
    if daily:
        models["seasonal_naive"] = SeasonalNaive()
        models["daily_blend"] = DailyBlend(weight=0.5, days=1)
        models["daily_blend_week"] = DailyBlend(weight=0.5, days=7)
    return models
