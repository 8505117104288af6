"""The candidates that join once the simple ones are scored: the tiered rankings
(:func:`with_tiered`) and, on a short history, the baselines' own tiers with calibrated counts
(:func:`with_calibrated`), each backtested on the same origins as the others."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Protocol

from models.backtest import Backtest, BacktestPlan, run_backtest
from models.baselines import HotnessModel, simple_models
from models.selection.rules import (
    MIN_LEARNING_ORIGINS,
    NOISE_SES,
    SHARE_TOLERANCE,
    TIERED,
    baseline_names,
    baseline_tiers,
    shortfall,
    simplest_unbeaten,
)
from models.tiered import TieredRanking, tier_rankers
from pipeline.evaluation import CountMatrix


class Selection(Protocol):
    """What the candidates read of the selection that scores them (a
    :class:`models.selection.forecaster.SelectedForecaster` being fitted)."""

    budgets: tuple[int, ...]
    budget_tokens: tuple[int, ...]
    horizon: int
    metric: str
    daily_: bool


def with_calibrated(
    matrix: CountMatrix,
    models: dict[str, HotnessModel],
    scored: Backtest,
    plan: BacktestPlan,
    selected: Selection,
) -> tuple[dict[str, HotnessModel], Backtest, str]:
    """The candidates and their backtest with the baselines' own tiers under calibrated counts
    (:func:`baseline_tiers`, a :class:`models.tiered.TieredRanking`; named
    ``<baseline>_calibrated`` when one baseline ranks every tier, else ``baselines_tiered``)
    scored on the same origins, last; and its name."""
    budgets = tuple(selected.budgets)
    t, seen = plan.last_t, matrix.seen_by(plan.last_t)
    ranks = {name: int((models[name].predict_at(matrix, t, seen) > 0).sum())
             for name in baseline_names(scored)}  # fmt: skip
    tiers, rest = baseline_tiers(scored, budgets, ranks)
    model = TieredRanking(budgets, tiers, rest, True, daily=selected.daily_,
                          horizon=selected.horizon)  # fmt: skip
    name = f"{tiers[0]}_calibrated" if len({*tiers, rest}) == 1 else "baselines_tiered"
    same_span = replace(plan, first_t=int(scored.origins[0]))
    tokens, horizon = tuple(selected.budget_tokens), selected.horizon
    alone = run_backtest(matrix, {name: model}, same_span, budgets, tokens, horizon,
                         selected.metric)  # fmt: skip
    return {**models, name: model}, scored.joined(alone, len(models)), name


def with_tiered(
    matrix: CountMatrix,
    models: dict[str, HotnessModel],
    scored: Backtest,
    plan: BacktestPlan,
    selected: Selection,
    rankers: Backtest | None = None,
) -> tuple[dict[str, HotnessModel], Backtest]:
    """The candidates and their backtest with the tiered rankings (:data:`TIERED`) scored on the
    same origins, last. ``rankers`` (the simple candidates' backtest over a wider span, where
    learners compete): each budget's tier ranked by the simplest of them within one standard
    error of the best at that budget, the rest by the lowest MAE's. Without it: ranking as the
    one :func:`choose` keeps of the simple ones (in tiers, :func:`models.tiered.tier_rankers`,
    when none holds and the backtest has the origins a learner needs)."""
    simple = [name for name in models if name in simple_models(selected.daily_)]
    budgets = tuple(selected.budgets)
    holding = [name for name in simple if shortfall(scored, name) <= 1.0]
    if rankers is not None:  # the history learners need: each tier by its own ranker
        tiers = tier_rankers(rankers, simple, budgets, 0.0, NOISE_SES)
        rest = min(simple, key=rankers.mae)
    elif holding or len(scored.origins) < MIN_LEARNING_ORIGINS:  # tiers are learned, too
        rest = simplest_unbeaten(scored, holding or [min(simple, key=partial(shortfall, scored))])
        tiers = (rest,) * len(budgets)
    else:
        tiers = tier_rankers(scored, simple, budgets, SHARE_TOLERANCE)
        rest = min(simple, key=scored.mae)
    tiered = {name: TieredRanking(budgets, tiers, rest, calibrated, daily=selected.daily_,
                                  horizon=selected.horizon)
              for name, calibrated in TIERED.items()}  # fmt: skip
    same_span = replace(plan, first_t=int(scored.origins[0]))
    alone = run_backtest(matrix, tiered, same_span, budgets, tuple(selected.budget_tokens),
                         selected.horizon, selected.metric)  # fmt: skip
    return {**models, **tiered}, scored.joined(alone, len(models))
