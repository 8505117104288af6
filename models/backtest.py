"""The rolling-origin backtest the forecaster selection chooses from, and its noise.

Every history end ``t`` of the backtest is a forecast origin: each candidate, fitted on the
windows up to its latest refit, predicts window ``t + horizon`` from windows ``0..t`` and is
judged there (:func:`pipeline.evaluation.walk_forward`), at every budget. Refits cut the span
into blocks, and the last origin is a block of its own. The size of a backtest is set in work
(origins, candidates, refits), never in seconds, so the same history and settings score the same
origins on an idle machine and on a loaded one; the blocks run oldest first, so every candidate
ends fitted at the last origin, as the backtest scored it there (what the selection keeps).

:class:`Backtest` keeps the per-origin numbers, so a difference between two candidates comes
with its own noise: the standard error of their paired difference across origins.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from pipeline.evaluation import (
    CountMatrix,
    HotnessPredictor,
    WalkForwardConfig,
    standard_error,
    walk_forward,
)

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

    @property
    def origins(self) -> int:
        """History ends scored."""
        return self.last_t - self.first_t + 1

    def blocks(self) -> list[tuple[int, int]]:
        """(first, last) history end of each refit block, oldest first; the last origin is a
        block of its own, so what is fitted there is what its score is of."""
        firsts = range(self.first_t, self.last_t, self.refit_every)
        earlier = [(first, min(first + self.refit_every, self.last_t) - 1) for first in firsts]
        return [*earlier, (self.last_t, self.last_t)]


def plan_backtest(
    end: int,
    horizon: int,
    min_learning: int,
    max_refits: int,
    min_learning_origins: int,
    requested: int | None = None,
) -> BacktestPlan | None:
    """The widest span the history up to ``end`` allows (``requested``: at most that many
    latest origins), refitted in at most ``max_refits`` blocks before the last origin's own,
    or ``None`` when not one target fits.

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
    earlier = last_t - first_t
    return BacktestPlan(first_t, last_t, max(1, math.ceil(earlier / max_refits)), learning)


@dataclass(frozen=True)
class Backtest:
    """Per-origin results of a backtest: ``captured[model, budget, origin]`` against
    ``oracle[budget, origin]`` (in the metric's unit), ``abs_error[model, origin]`` over
    ``n_scored[origin]`` items, and the wall-clock and CPU seconds it took (reported, never
    decided on)."""

    models: tuple[str, ...]
    budgets: tuple[str, ...]
    origins: np.ndarray
    captured: np.ndarray
    oracle: np.ndarray
    abs_error: np.ndarray
    n_scored: np.ndarray
    seconds: float
    cpu_seconds: float = 0.0

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
                       seconds=self.seconds + other.seconds,
                       cpu_seconds=self.cpu_seconds + other.cpu_seconds)  # fmt: skip

    def mae_noise(self, a: str, b: str) -> float:
        """Standard error of ``mae(a) - mae(b)`` from its spread across origins."""
        diff = self.abs_error[self.models.index(a)] - self.abs_error[self.models.index(b)]
        return float(standard_error(diff[None, :])[0] / max(float(self.n_scored.sum()), 1.0))


def run_backtest(
    matrix: CountMatrix,
    models: Mapping[str, HotnessPredictor],
    plan: BacktestPlan,
    budgets: tuple[int, ...],
    budget_tokens: tuple[int, ...] = (),
    horizon: int = 1,
    metric: str = "requests",
) -> Backtest:
    """Run every block of ``plan``, oldest first (each candidate ends fitted at the last
    origin), and collect the per-origin results."""
    started, cpu = time.perf_counter(), time.process_time()
    parts: list[pd.DataFrame] = []
    for first, last in plan.blocks():
        config = WalkForwardConfig(budget_items=budgets, budget_tokens=budget_tokens,
                                   first_t=first, last_t=last, refit_every=last - first + 1,
                                   horizon=horizon)  # fmt: skip
        parts.append(walk_forward(matrix, models, config).steps)
    backtest = _collect(pd.concat(parts, ignore_index=True), tuple(models), metric)
    return replace(backtest, seconds=time.perf_counter() - started,
                   cpu_seconds=time.process_time() - cpu)  # fmt: skip


def _collect(steps: pd.DataFrame, models: tuple[str, ...], metric: str) -> Backtest:
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
    return Backtest(models, budgets, origins, captured, oracle, abs_error, n_scored, 0.0)
