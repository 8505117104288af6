"""Choosing the hotness model by backtest, so the one in use never loses to a baseline.

On every fit, :class:`SelectedForecaster` scores candidates — the baselines, two blends of them,
and LightGBM with each of its objectives — by a rolling-origin backtest on the latest windows of
the same history: every candidate learns from the windows before the backtest's origin, then
predicts each of the following windows from the history up to the one before it (``horizon``
windows ahead), judged with the metric the planner cares about: the captured share of the history
oracle at the plan's budget(s) (:mod:`pipeline.evaluation`), in requests (``metric="requests"``,
what a warm cache serves window after window) or in first uses (``metric="first_uses"``: the
items a window uses at all, what a warm-up after a restart saves). Candidates within
``share_tolerance`` of the best share are a tie, broken by the lowest MAE. The winner is then
fitted on the whole history and does the predicting; its backtest table goes with it into the
saved model's metadata (:func:`selection_metadata`), where the planner and ``prewarm status``
read it back (:func:`load_selected`, :func:`saved_selection`).

With too little history for LightGBM to learn from (fewer than ``min_learning_windows`` windows
before the origin) only the baselines and blends compete, and the report says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from models.baselines import (
    EWMA,
    DailyBlend,
    FrequencyEstimate,
    HotnessModel,
    LastWindow,
    MovingAverage,
    RecencyBlend,
    SeasonalNaive,
    _until,
)
from models.features import FEATURE_NAMES, windows_per_day
from models.persistence import ModelState, load_model, read_saved
from pipeline.errors import BadInputError
from pipeline.evaluation import CountMatrix, WalkForwardConfig, walk_forward

#: LightGBM objectives tried on every selection.
OBJECTIVES = ("poisson", "tweedie", "median")
#: The moving average's share in the blend candidate (LightGBM ``median`` and the average).
BLEND_SHARE = 0.5
#: The metadata key (under ``extra``) of a saved model's selection report.
SELECTION_KEY = "selection"
#: Backtest length cap when the window does not divide a day (one day of windows otherwise).
MAX_BACKTEST_WINDOWS = 24
#: A day of 10-minute windows: the longest backtest (ServeGen's daily cycle fits in it).
MAX_DAY_WINDOWS = 144
#: What a backtest's share counts: the column of :func:`pipeline.evaluation.summarise` per metric.
METRICS = {
    "requests": "share_of_history_oracle",
    "first_uses": "first_use_share_of_history_oracle",
}
#: Item-windows a backtest scores at most: on Mooncake's ~180,000 blocks, 11 one-minute
#: windows; 6 LightGBM predictions of 180,000 rows take ~2 s each on this machine.
MAX_BACKTEST_CELLS = 2_000_000


def candidate_models(
    learning: bool, horizon: int = 1, daily: bool = True
) -> dict[str, HotnessModel]:
    """Fresh candidates by name, simplest first: baselines, blends, the day-aware ones
    (``daily``: with a day of history; before it they equal the last window and the EWMA),
    and (``learning``) LightGBM with each objective and the ``median`` one blended with the
    moving average (one training serves both)."""
    models: dict[str, HotnessModel] = {
        "last_window": LastWindow(),
        "moving_average": MovingAverage(),
        "ewma": EWMA(),
        "frequency": FrequencyEstimate(),
        "recency_blend": RecencyBlend(weight=0.7),
        "recency_blend_0.9": RecencyBlend(weight=0.9),
    }
    if daily:
        models["seasonal_naive"] = SeasonalNaive()
        models["daily_blend"] = DailyBlend(weight=0.5, days=1)
        models["daily_blend_week"] = DailyBlend(weight=0.5, days=7)
    if learning:
        from models.forecaster import HotnessForecaster  # lightgbm: import only when it competes

        trees = {o: HotnessForecaster(objective=o, horizon=horizon) for o in OBJECTIVES}
        models.update({f"lightgbm_{objective}": model for objective, model in trees.items()})
        models["lightgbm_median_blend"] = trees["median"].blended(BLEND_SHARE)
    return models


def backtest_windows(matrix: CountMatrix, end: int, requested: int | None = None) -> int:
    """History ends a backtest at ``end`` may score: ``requested``, else one day of windows
    (:data:`MAX_BACKTEST_WINDOWS` when the window does not divide a day, at most
    :data:`MAX_DAY_WINDOWS`) and at most :data:`MAX_BACKTEST_CELLS` item-windows; at least 1."""
    if requested is not None:
        return max(1, requested)
    per_day = min(windows_per_day(matrix.window) or MAX_BACKTEST_WINDOWS, MAX_DAY_WINDOWS)
    seen = max(1, len(matrix.seen_by(end)))
    return max(1, min(per_day, MAX_BACKTEST_CELLS // seen))


def backtest_origin(end: int, span: int, horizon: int, min_learning: int) -> tuple[int, bool]:
    """The backtest's first history end, and whether LightGBM can compete.

    LightGBM learns from the windows up to the origin, so it competes only when half the
    history (at most ``span`` windows) is backtest and the rest holds ``min_learning`` windows;
    the baselines learn nothing, so without it the backtest may reach back to window 0.
    """
    learning_span = min(span, (end + 1) // 2)
    origin = end - learning_span - horizon + 1
    if origin + 1 >= min_learning:
        return origin, True
    return max(0, end - span - horizon + 1), False


def choose(table: pd.DataFrame, share_tolerance: float) -> str:
    """The winner of a backtest table: the best share, ties (within ``share_tolerance``) broken
    by the lowest MAE, then by the table's order (the simpler candidates come first)."""
    best = float(table["share"].max())
    tied = table[table["share"] >= best - share_tolerance]
    return str(tied.sort_values("mae", kind="stable").iloc[0]["model"])


def backtest(
    matrix: CountMatrix,
    models: dict[str, HotnessModel],
    origin: int,
    end: int,
    budgets: tuple[int, ...],
    horizon: int = 1,
    metric: str = "requests",
) -> pd.DataFrame:
    """Per candidate: mean share of the history oracle over ``budgets`` (in ``metric``, a key
    of :data:`METRICS`), MAE, and seconds, fitted on windows ``0..origin`` and judged on
    targets ``origin + horizon .. end``."""
    config = WalkForwardConfig(
        budget_items=budgets,
        first_t=origin,
        last_t=end - horizon,
        refit_every=end + 1,  # one fit, at the origin
        horizon=horizon,
    )
    started = time.perf_counter()
    table = walk_forward(matrix, models, config).table
    seconds = time.perf_counter() - started
    scores = table.groupby("model", sort=False).agg(
        share=(METRICS[metric], "mean"), mae=("mae", "first")
    )
    scores["share"] = scores["share"].fillna(0.0)
    scores = scores.reset_index()
    scores["kind"] = [models[name].name for name in scores["model"]]
    scores.attrs["seconds"] = seconds
    return scores


class SelectedForecaster(HotnessModel):
    """The backtest winner among :func:`candidate_models`; see the module docstring.

    ``budgets``: the plan's item budget(s) the share is measured at; ``backtest`` the history
    ends scored (default: :func:`backtest_windows`); ``horizon`` the window ahead predicted;
    ``metric`` what the share counts (a key of :data:`METRICS`).
    """

    name = "selected"

    def __init__(
        self,
        budgets: tuple[int, ...] = (100,),
        backtest: int | None = None,
        horizon: int = 1,
        share_tolerance: float = 0.005,
        min_learning_windows: int = 12,
        learning: bool = True,
        metric: str = "requests",
    ) -> None:
        if metric not in METRICS:
            raise BadInputError(f"unknown metric {metric!r} (one of {', '.join(METRICS)})",
                                where="selection metric")  # fmt: skip
        self.metric = metric
        self.budgets = budgets
        self.backtest = backtest
        self.horizon = horizon
        self.share_tolerance = share_tolerance
        self.min_learning_windows = min_learning_windows
        self.learning = learning

    def fit(self, matrix: CountMatrix, until: int | None = None) -> SelectedForecaster:
        """Backtest the candidates on the latest windows up to ``until``, keep the winner
        fitted on all of them; returns ``self``."""
        started = time.perf_counter()
        end = _until(matrix, until)
        span = backtest_windows(matrix, end, self.backtest)
        needed = self.min_learning_windows if self.learning else end + 2
        origin, learning = backtest_origin(end, span, self.horizon, needed)
        if origin > end - self.horizon:
            raise BadInputError(
                f"{end + 1} windows are too few to backtest {self.horizon} window(s) ahead",
                where="counts",
            )
        period = windows_per_day(matrix.window)
        daily = period is not None and origin + self.horizon > period
        models = candidate_models(learning, self.horizon, daily)
        self.table_ = backtest(matrix, models, origin, end, tuple(self.budgets), self.horizon,
                               self.metric)  # fmt: skip
        self.winner_name_ = choose(self.table_, self.share_tolerance)
        self.winner_ = models[self.winner_name_].fit(matrix, end)
        self.note_ = _note(learning, self.learning, end + 1, self.min_learning_windows)
        self.backtest_span_ = (matrix.window_start(origin), matrix.window_start(end))
        self.seconds_ = time.perf_counter() - started
        self.window_ = matrix.window
        self.trained_until_ = matrix.window_start(end)
        return self

    def _predict(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray:
        return self.winner_._predict(matrix, t, items, horizon)

    def report(self) -> dict[str, Any]:
        """The selection as JSON values: winner, its kind, the backtest table and its span."""
        self._check_fitted()
        return {
            "winner": self.winner_name_,
            "kind": self.winner_.name,
            "budgets": list(self.budgets),
            "metric": self.metric,
            "horizon": self.horizon,
            "backtest_from": self.backtest_span_[0].isoformat(),
            "backtest_until": self.backtest_span_[1].isoformat(),
            "note": self.note_,
            "seconds": round(self.seconds_, 3),
            "table": [_row(r) for r in self.table_.itertuples()],
        }

    def feature_names(self) -> list[str]:
        """The features the winner reads."""
        winner = getattr(self, "winner_", None)
        return winner.feature_names() if winner is not None else list(FEATURE_NAMES)

    def export_state(self) -> ModelState:
        """Not saved itself: save :attr:`winner_` with :func:`selection_metadata`."""
        raise BadInputError(
            "save the winner (selected.winner_) with selection_metadata(selected)",
            where="SelectedForecaster",
        )


def _row(row: Any) -> dict[str, Any]:
    return {"model": str(row.model), "kind": str(row.kind), "share": float(row.share),
            "mae": float(row.mae)}  # fmt: skip


def _note(learning: bool, wanted: bool, history: int, needed: int) -> str:
    if learning:
        return "baselines, blends and LightGBM compared"
    if not wanted:
        return "baselines and blends only (LightGBM not asked for)"
    return (
        f"baselines and blends only: {history} window(s) of history, too few for LightGBM "
        f"(it needs {needed} before a backtest of the latest half)"
    )


def selection_metadata(selected: SelectedForecaster) -> dict[str, Any]:
    """The ``extra`` metadata to save the winner with (``save_model(..., extra=...)``)."""
    return {SELECTION_KEY: selected.report()}


@dataclass(frozen=True)
class SavedForecaster:
    """A saved hotness model as loaded: the model, and its selection report if it has one."""

    model: HotnessModel
    version: str
    selection: dict[str, Any] | None

    @property
    def winner(self) -> str | None:
        """The candidate name that won the backtest (``None``: saved without selection)."""
        return None if self.selection is None else str(self.selection["winner"])


def load_selected(root: str | Path, name: str) -> SavedForecaster:
    """Load the current saved hotness model (whatever kind won) and its selection report."""
    saved = read_saved(root, name)
    model = load_model(root, name, version=saved.path.name)
    if not isinstance(model, HotnessModel):
        raise BadInputError(f"{saved.metadata.get('kind')!r} is not a hotness model",
                            where=str(saved.path / "metadata.json"))  # fmt: skip
    selection = saved.metadata.get("extra", {}).get(SELECTION_KEY)
    return SavedForecaster(model, saved.path.name, selection)


def saved_selection(root: str | Path, name: str) -> dict[str, Any] | None:
    """What ``prewarm status`` shows of the saved hotness model: its version, kind, winner and
    backtest table (``None`` when nothing is saved)."""
    try:
        saved = read_saved(root, name)
    except BadInputError:
        return None
    selection = saved.metadata.get("extra", {}).get(SELECTION_KEY) or {}
    return {
        "version": saved.path.name,
        "kind": saved.metadata.get("kind"),
        "trained_until": saved.metadata.get("training_range", {}).get("until"),
        "winner": selection.get("winner", saved.metadata.get("kind")),
        "note": selection.get("note"),
        "table": selection.get("table", []),
    }


def winner_table(report: dict[str, Any]) -> pd.DataFrame:
    """A selection report's backtest table, best share first."""
    table = pd.DataFrame(report.get("table", []), columns=["model", "kind", "share", "mae"])
    return table.sort_values(["share", "mae"], ascending=[False, True]).reset_index(drop=True)
