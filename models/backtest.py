"""The rolling-origin backtest the forecaster selection chooses from, and its noise.

Every history end ``t`` of the backtest is a forecast origin: each candidate, fitted on the
windows up to its latest refit, predicts window ``t + horizon`` from windows ``0..t`` and is
judged there (:func:`pipeline.evaluation.walk_forward`), at every budget. Refits cut the span
into blocks; the blocks are run latest first, and the span reaches back as far as the time
budget allows (the next block is run only while the time spent so far says it fits).

:class:`Backtest` keeps the per-origin numbers, so a difference between two candidates comes
with its own noise: the standard error of their paired difference across origins.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from pipeline.evaluation import CountMatrix, HotnessPredictor, WalkForwardConfig, walk_forward

#: What a backtest's share counts: the numerator and denominator columns of the walk-forward's
#: steps per metric (``requests``: what a warm cache serves; ``first_uses``: what a warm-up
#: after a restart saves).
METRIC_COLUMNS = {
    "requests": ("captured", "history_oracle"),
    "first_uses": ("first_uses", "first_use_oracle"),
}


@dataclass(frozen=True)
class BacktestPlan:
    """Where a backtest may score: history ends ``first_t..last_t``, refit every
    ``refit_every`` of them, and whether learners can compete (enough windows before)."""

    first_t: int
    last_t: int
    refit_every: int
    learning: bool

    def blocks(self) -> list[tuple[int, int]]:
        """(first, last) history end of each refit block, latest first."""
        lasts = range(self.last_t, self.first_t - 1, -self.refit_every)
        return [(max(self.first_t, last - self.refit_every + 1), last) for last in lasts]


def plan_backtest(
    end: int,
    horizon: int,
    min_learning: int,
    max_refits: int,
    min_learning_origins: int,
    requested: int | None = None,
) -> BacktestPlan | None:
    """The widest span the history up to ``end`` allows (``requested``: at most that many
    latest origins), or ``None`` when not one target fits.

    Learners need ``min_learning`` windows before the first origin and at least
    ``min_learning_origins`` origins to be judged on; otherwise only what learns nothing
    competes, from window 1 on.
    """
    last_t = end - horizon
    latest_first = last_t - requested + 1 if requested is not None else 0
    learned_first = max(min_learning - 1, latest_first)
    learning = last_t - learned_first + 1 >= min_learning_origins
    first_t = learned_first if learning else max(1, latest_first)
    if first_t > last_t:
        first_t = max(0, latest_first)
        if first_t > last_t:
            return None
    span = last_t - first_t + 1
    return BacktestPlan(first_t, last_t, math.ceil(span / max_refits), learning)


@dataclass(frozen=True)
class Backtest:
    """Per-origin results of a backtest: ``captured[model, budget, origin]`` against
    ``oracle[budget, origin]`` (in the metric's unit), ``abs_error[model, origin]`` over
    ``n_scored[origin]`` items, and the span and seconds it took."""

    models: tuple[str, ...]
    budgets: tuple[str, ...]
    origins: np.ndarray
    captured: np.ndarray
    oracle: np.ndarray
    abs_error: np.ndarray
    n_scored: np.ndarray
    seconds: float

    def share(self, model: str) -> np.ndarray:
        """Share of the history oracle per budget."""
        i = self.models.index(model)
        return self.captured[i].sum(axis=1) / np.maximum(self.oracle.sum(axis=1), 1e-12)

    def mae(self, model: str) -> float:
        """Mean absolute error over every origin's scored items."""
        i = self.models.index(model)
        return float(self.abs_error[i].sum() / max(float(self.n_scored.sum()), 1.0))

    def share_noise(self, a: str, b: str) -> np.ndarray:
        """Standard error, per budget, of ``share(a) - share(b)`` from its spread across
        origins (infinite with one origin: nothing to tell noise from)."""
        diff = self.captured[self.models.index(a)] - self.captured[self.models.index(b)]
        return standard_error(diff) / np.maximum(self.oracle.sum(axis=1), 1e-12)

    def joined(self, other: Backtest, at: int) -> Backtest:
        """This backtest with ``other``'s candidates (scored on the same origins and budgets)
        placed at position ``at``."""
        if not np.array_equal(self.origins, other.origins) or self.budgets != other.budgets:
            raise ValueError("backtests of different origins or budgets cannot be joined")

        def insert(mine: np.ndarray, theirs: np.ndarray) -> np.ndarray:
            return np.concatenate([mine[:at], theirs, mine[at:]])

        models = (*self.models[:at], *other.models, *self.models[at:])
        return replace(self, models=models, captured=insert(self.captured, other.captured),
                       abs_error=insert(self.abs_error, other.abs_error),
                       seconds=self.seconds + other.seconds)  # fmt: skip

    def mae_noise(self, a: str, b: str) -> float:
        """Standard error of ``mae(a) - mae(b)`` from its spread across origins."""
        diff = self.abs_error[self.models.index(a)] - self.abs_error[self.models.index(b)]
        return float(standard_error(diff[None, :])[0] / max(float(self.n_scored.sum()), 1.0))


def standard_error(per_origin: np.ndarray) -> np.ndarray:
    """Standard error of a sum over origins (last axis): sqrt(n) x the origins' spread."""
    n = per_origin.shape[-1]
    if n < 2:
        return np.full(per_origin.shape[:-1], np.inf)
    return np.sqrt(n) * per_origin.std(axis=-1, ddof=1)


def run_backtest(
    matrix: CountMatrix,
    models: Mapping[str, HotnessPredictor],
    plan: BacktestPlan,
    budgets: tuple[int, ...],
    budget_tokens: tuple[int, ...] = (),
    horizon: int = 1,
    metric: str = "requests",
    time_budget_s: float = float("inf"),
    clock: Callable[[], float] = time.perf_counter,
) -> Backtest:
    """Run ``plan``'s blocks latest first while the time spent says the next one fits in
    ``time_budget_s`` (the latest block always runs), and collect the per-origin results."""
    started = clock()
    parts: list[pd.DataFrame] = []
    for done, (first, last) in enumerate(plan.blocks()):
        spent = clock() - started
        if done and spent + spent / done > time_budget_s:
            break
        config = WalkForwardConfig(budget_items=budgets, budget_tokens=budget_tokens,
                                   first_t=first, last_t=last, refit_every=last - first + 1,
                                   horizon=horizon)  # fmt: skip
        parts.append(walk_forward(matrix, models, config).steps)
    return _collect(pd.concat(parts, ignore_index=True), tuple(models), metric, clock() - started)


def _collect(steps: pd.DataFrame, models: tuple[str, ...], metric: str, seconds: float) -> Backtest:
    """The steps of a walk-forward as arrays by model, budget and origin."""
    numerator, denominator = METRIC_COLUMNS[metric]
    budgets = tuple(dict.fromkeys(steps["budget"]))
    origins = np.sort(steps["t"].unique())

    def grid(column: str) -> np.ndarray:
        table = steps.pivot_table(index=["model", "budget"], columns="t", values=column,
                                  aggfunc="first", sort=False)  # fmt: skip
        index = pd.MultiIndex.from_product([models, budgets])
        return (
            table.reindex(index=index, columns=origins)
            .to_numpy(np.float64)
            .reshape(len(models), len(budgets), len(origins))
        )

    captured = grid(numerator)
    oracle = grid(denominator)[0]
    abs_error = grid("abs_error")[:, 0, :]
    n_scored = grid("n_scored")[0, 0]
    return Backtest(models, budgets, origins, captured, oracle, abs_error, n_scored, seconds)
