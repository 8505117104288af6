"""The selected forecaster: the backtest winner among the candidates, kept as the backtest
fitted it at its last origin (see :mod:`models.selection`)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from models.backtest import Backtest, BacktestPlan, plan_backtest, run_backtest
from models.baselines import HotnessModel, _until, simple_models
from models.features import FEATURE_NAMES, windows_per_day
from models.persistence import ModelState
from models.selection.candidates import with_calibrated, with_tiered
from models.selection.rules import (
    FIRST_TIER_ORIGIN,
    MAX_ORIGINS,
    MAX_REFITS,
    MAX_TIER_ORIGINS,
    METRICS,
    MIN_LEARNING_ORIGINS,
    SHORT_HISTORY,
    _row,
    backtest_table,
    candidate_models,
    choose,
    margin,
)
from models.tiered import TieredRanking
from pipeline.errors import BadInputError
from pipeline.evaluation import CountMatrix


class SelectedForecaster(HotnessModel):
    """The backtest winner among :func:`candidate_models`; see the module docstring.

    ``budgets`` (items) and ``budget_tokens`` (tokens): the plans' budgets the share is
    measured at; ``backtest`` the origins scored at most (the latest ones); ``horizon`` the
    window ahead predicted; ``metric`` what the share counts (one of :data:`METRICS`);
    ``short_history`` the windows below which a baseline the backtest cannot tell apart from
    the best is preferred.
    """

    name = "selected"

    def __init__(
        self,
        budgets: tuple[int, ...] = (100,),
        backtest: int | None = MAX_ORIGINS,
        horizon: int = 1,
        min_learning_windows: int = 12,
        learning: bool = True,
        metric: str = "requests",
        budget_tokens: tuple[int, ...] = (),
        short_history: int = SHORT_HISTORY,
    ) -> None:
        if metric not in METRICS:
            raise BadInputError(f"unknown metric {metric!r} (one of {', '.join(METRICS)})",
                                where="selection metric")  # fmt: skip
        self.metric = metric
        self.budgets = budgets
        self.budget_tokens = budget_tokens
        self.backtest = backtest
        self.horizon = horizon
        self.min_learning_windows = min_learning_windows
        self.learning = learning
        self.short_history = short_history

    def fit(self, matrix: CountMatrix, until: int | None = None) -> SelectedForecaster:
        """Backtest the candidates on the latest ``backtest`` origins up to ``until`` and keep
        the winner as the backtest fitted it at the last one; returns ``self``."""
        started, cpu = time.perf_counter(), time.process_time()
        end = _until(matrix, until)
        short = end + 1 < self.short_history
        # A short history's few origins cannot vouch for a learner: it does not compete.
        needed = self.min_learning_windows if self.learning and not short else end + 2
        plan = plan_backtest(end, self.horizon, needed, MAX_REFITS, MIN_LEARNING_ORIGINS,
                             self.backtest)  # fmt: skip
        if plan is None:
            raise BadInputError(
                f"{end + 1} windows are too few to backtest {self.horizon} window(s) ahead",
                where="counts",
            )
        period = windows_per_day(matrix.window)
        self.daily_ = period is not None and plan.first_t + self.horizon > period
        models = candidate_models(plan.learning, self.horizon, self.daily_)
        scored = run_backtest(matrix, models, plan, tuple(self.budgets),
                              tuple(self.budget_tokens), self.horizon, self.metric)  # fmt: skip
        if self.budgets:
            rankers = self._rankers_backtest(matrix, models, plan) if plan.learning else None
            models, scored = with_tiered(matrix, models, scored, plan, self, rankers)
        if short and self.budgets:  # the baselines' own ranking, in tiers: nothing learned
            models, scored, self.winner_name_ = with_calibrated(matrix, models, scored, plan, self)
        else:
            self.winner_name_ = choose(scored)
        self.backtest_ = scored
        self.table_ = backtest_table(scored, {name: m.name for name, m in models.items()})
        self.margin_ = margin(scored, self.winner_name_)
        # What the backtest scored at its last origin, not a refit that could rank otherwise.
        self.winner_ = models[self.winner_name_]
        self.note_ = _note(plan.learning, self.learning, end + 1, self.min_learning_windows,
                           self.short_history)  # fmt: skip
        if short:
            self.note_ += "; " + _short_note(end + 1, self.short_history, self.winner_)
        self.backtest_span_ = (matrix.window_start(plan.first_t), matrix.window_start(end))
        self.plan_ = plan
        self.seconds_ = time.perf_counter() - started
        self.cpu_seconds_ = time.process_time() - cpu
        self.window_ = matrix.window
        self.trained_until_ = matrix.window_start(end)
        return self

    def _rankers_backtest(
        self, matrix: CountMatrix, models: dict[str, HotnessModel], plan: BacktestPlan
    ) -> Backtest:
        """The simple candidates' backtest from :data:`FIRST_TIER_ORIGIN` on (the learners'
        starts later), over :data:`MAX_TIER_ORIGINS` at most: what the tiers' rankers are
        chosen by."""
        simple = {name: model for name, model in models.items()
                  if name in simple_models(self.daily_)}  # fmt: skip
        first = max(min(plan.first_t, FIRST_TIER_ORIGIN), plan.last_t - MAX_TIER_ORIGINS + 1)
        wide = replace(plan, first_t=first)
        return run_backtest(matrix, simple, wide, tuple(self.budgets), tuple(self.budget_tokens),
                            self.horizon, self.metric)  # fmt: skip

    def _predict(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray:
        return self.winner_._predict(matrix, t, items, horizon)

    def report(self) -> dict[str, Any]:
        """The selection as JSON values: winner, its kind, margin, the backtest table and span."""
        self._check_fitted()
        return {
            "winner": self.winner_name_,
            "kind": self.winner_.name,
            "budgets": list(self.budgets),
            "budget_tokens": list(self.budget_tokens),
            "metric": self.metric,
            "horizon": self.horizon,
            "backtest_from": self.backtest_span_[0].isoformat(),
            "backtest_until": self.backtest_span_[1].isoformat(),
            "note": self.note_,
            "origins": self.plan_.origins,
            "refit_every": self.plan_.refit_every,
            "seconds": round(self.seconds_, 3),
            "cpu_seconds": round(self.cpu_seconds_, 3),
            "margin": self.margin_,
            "tiers": list(self.winner_.tiers) if isinstance(self.winner_, TieredRanking) else None,
            "table": [_row(r) for r in self.table_.to_dict(orient="records")],
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


def _short_note(history: int, short: int, winner: HotnessModel) -> str:
    head = f"short history ({history} windows, under {short}): "
    if not isinstance(winner, TieredRanking):  # token budgets only: chosen as on a long one
        return head + "no item budget to rank the baselines' tiers by; chosen as on a long one"
    tiers = ", ".join(f"{b}: {name}" for b, name in zip(winner.budgets, winner.tiers, strict=True))
    if len({*winner.tiers, winner.rest}) == 1:
        return head + (f"kept the baseline {winner.rest}, which the backtest cannot tell apart "
                       f"from the best at any budget, counts calibrated")  # fmt: skip
    ranked = (f"each budget ranked by the baseline the backtest cannot tell apart from the best "
              f"there ({tiers}; the rest by the lowest MAE's, {winner.rest})")  # fmt: skip
    return head + ranked + ", counts calibrated"


def _note(learning: bool, wanted: bool, history: int, needed: int, short: int) -> str:
    if learning:
        return "baselines, blends, tiered rankings and LightGBM compared"
    if not wanted:
        return "baselines, blends and tiered rankings only (LightGBM not asked for)"
    return (
        f"baselines, blends and tiered rankings only: {history} window(s) of history, too few for "
        f"LightGBM (it needs {short} windows, {needed} before the backtest and "
        f"{MIN_LEARNING_ORIGINS} origins in it)"
    )
