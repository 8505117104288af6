"""The rules of the choice: the candidates, how far one falls behind the best baseline, when a
more complex one beats a simpler one, and a short history's baseline tiers.

A candidate that loses to the best baseline (:func:`shortfall`) is never chosen; of the others the
simplest is kept unless a later one beats it by more than the backtest's own noise
(:func:`beats`, the one-standard-error rule). On a short history each item budget is ranked by a
baseline the backtest cannot tell apart from the best one there (:func:`baseline_tiers`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from models.backtest import METRIC_COLUMNS, Backtest
from models.baselines import HotnessModel, baselines, simple_models

#: The tiered rankings (:class:`models.tiered.TieredRanking`) by name: calibrated counts or not.
TIERED = {"tiered": False, "tiered_calibrated": True}
#: LightGBM objectives tried on every selection.
OBJECTIVES = ("poisson", "tweedie", "median")
#: The moving average's share in the blend candidate (LightGBM ``median`` and the average).
BLEND_SHARE = 0.5
#: The metrics a selection may score by.
METRICS = tuple(METRIC_COLUMNS)
#: How far behind the best baseline a candidate may be on the backtest and still be chosen: half
#: of what the winner may lose on later windows (a point of the history oracle at every budget,
#: 2% of MAE, as ``benchmarks/forecast_eval.py`` checks), the rest left for those windows.
#: Point estimates, not standard errors: a gap measured in a pair's own noise would favour the
#: candidates least like any baseline, whose differences are the noisiest.
SHARE_TOLERANCE, MAE_TOLERANCE = 0.005, 0.01
#: Standard errors a more complex candidate must be better by to be preferred.
NOISE_SES = 1.0
#: Origins a selection's backtest scores at most (the latest ones): its size in work, never in
#: seconds, so a choice does not depend on the machine's load.
MAX_ORIGINS = 48
#: Origins the tiers' rankers are judged on at most (simple models only: cheap).
MAX_TIER_ORIGINS = 96
#: Refit blocks the backtest's span is cut into at most before the last origin (each refits
#: every candidate), and the last origin's own.
MAX_REFITS = 8
#: A short history's tier goes to a baseline within half a point of the best only where it scores
#: this many times the budget's items above zero at the last origin (past those it ranks by
#: position); a shallower one must be the best. On a shared-heads trace in 1-minute windows a
#: moving average 0.1 point behind the EWMA at 1,000 blocks, scoring 1,034 blocks at the origin,
#: lost 3 points to it on the next windows; in 5-minute windows the last window, the best there
#: by 7 points and scoring 1,339 blocks, was the best on the next windows too.
RANK_DEPTH = 2
#: Windows of history below which the choice prefers a baseline the backtest cannot tell apart
#: from the best (tens of windows: too few origins to trust a lead of anything more complex).
SHORT_HISTORY = 48
#: Origins learners (LightGBM, the tiers of the tiered rankings) must be judged on.
MIN_LEARNING_ORIGINS = 6
#: The first origin the tiers' rankers are judged from (six windows of history: the moving
#: average's span), even where LightGBM's backtest starts later: more origins, less noise.
FIRST_TIER_ORIGIN = 5


def candidate_models(
    learning: bool, horizon: int = 1, daily: bool = True
) -> dict[str, HotnessModel]:
    """Fresh candidates by name, simplest first: baselines, blends, the day-aware ones
    (``daily``: with a day of history; before it they equal the last window and the EWMA),
    and (``learning``) LightGBM with each objective and the ``median`` one blended with the
    moving average (one training serves both). The tiered rankings join last, once these are
    scored (:func:`with_tiered`)."""
    models = simple_models(daily)
    if learning:
        from models.forecaster import HotnessForecaster  # lightgbm: import only when it competes

        trees = {o: HotnessForecaster(objective=o, horizon=horizon) for o in OBJECTIVES}
        models.update({f"lightgbm_{objective}": model for objective, model in trees.items()})
        models["lightgbm_median_blend"] = trees["median"].blended(BLEND_SHARE)
    return models


def baseline_names(backtest: Backtest) -> list[str]:
    """The backtest's candidates that are baselines (what the winner must not lose to)."""
    return [name for name in backtest.models if name in baselines()]


def shortfall(backtest: Backtest, model: str) -> float:
    """How far ``model`` falls behind the best baseline, in tolerances: the largest of its share
    gap to each budget's best baseline over :data:`SHARE_TOLERANCE` and its MAE excess over the
    lowest baseline MAE over :data:`MAE_TOLERANCE` (> 1: it loses to a baseline)."""
    names = baseline_names(backtest)
    best_share = np.max([backtest.share(name) for name in names], axis=0)
    best_mae = min(backtest.mae(name) for name in names)
    gap = float(np.max(best_share - backtest.share(model))) / SHARE_TOLERANCE
    excess = (backtest.mae(model) / max(best_mae, 1e-12) - 1.0) / MAE_TOLERANCE
    return max(gap, excess)


def beats(backtest: Backtest, challenger: str, incumbent: str) -> bool:
    """Whether ``challenger`` is better than ``incumbent`` by more than the noise (at some
    budget or in MAE) and worse by more than it nowhere."""
    share_gain = backtest.share(challenger) - backtest.share(incumbent)
    share_noise = NOISE_SES * backtest.share_noise(challenger, incumbent)
    mae_gain = backtest.mae(incumbent) - backtest.mae(challenger)
    mae_noise = NOISE_SES * backtest.mae_noise(challenger, incumbent)
    if np.any(share_gain < -share_noise) or mae_gain < -mae_noise:
        return False
    return bool(np.any(share_gain > share_noise) or mae_gain > mae_noise)


def choose(backtest: Backtest) -> str:
    """The winner of a backtest (see the module docstring): among the candidates that do not
    lose to the best baseline, the simplest one no more complex one beats by more than noise."""
    shortfalls = {name: shortfall(backtest, name) for name in backtest.models}
    eligible = [name for name, s in shortfalls.items() if s <= 1.0]
    if not eligible:  # nothing holds: the nearest to the best baseline
        eligible = [min(shortfalls, key=shortfalls.__getitem__)]
    return simplest_unbeaten(backtest, eligible)


def simplest_unbeaten(backtest: Backtest, names: list[str]) -> str:
    """Of ``names`` (simplest first), the simplest one no later one beats by more than noise."""
    winner = names[0]
    for challenger in names[1:]:
        if beats(backtest, challenger, winner):
            winner = challenger
    return winner


def baseline_tiers(
    backtest: Backtest, budgets: tuple[int, ...], ranks: dict[str, int]
) -> tuple[tuple[str, ...], str]:
    """A short history's rankers: each item budget's the simplest baseline the backtest cannot
    tell apart from the best one there (:func:`indistinguishable`: within
    :data:`SHARE_TOLERANCE`), of those that rank :data:`RANK_DEPTH` times that many items or as
    many as the deepest one (``ranks[name]``: the items it scores above zero at the last origin;
    past them it ranks by position), a shallower one only as the best (on a tie, the best over
    every budget, then the lowest MAE); and the rest's the baseline with the lowest MAE.

    Within half a point, not within one standard error of the paired difference: a short
    backtest's standard error is widest for the noisiest ranker, the last window, which the
    rule then keeps (on the shared-heads trace of seed 7 in 10-minute windows, 1.2 points
    behind the frequency estimate at 20 blocks over 26 origins, within one standard error, and
    7 points behind it on the next windows). Nor the best over every budget of those within the
    noise: it keeps the frequency estimate, whose top 20 lags a head's swing (seeds 0, 9 and 14
    in 1-minute windows lost 6.4-6.8 points at 20 blocks, outside the bound)."""
    names = baseline_names(backtest)
    overall = {name: (float(backtest.share(name).mean()), -backtest.mae(name)) for name in names}
    tiers: list[str] = []
    for budget in budgets:
        i = backtest.budgets.index(f"{budget} items")
        # On a tie (every one takes all a window's items), the best over every budget.
        best = max(names, key=lambda name: (float(backtest.share(name)[i]), *overall[name]))
        depth = min(RANK_DEPTH * budget, max(ranks.get(name, 0) for name in names))
        deep = [name for name in names if ranks.get(name, 0) >= depth]
        tiers.append(indistinguishable(backtest, deep, i, best)[0] if best in deep else best)
    return tuple(tiers), min(names, key=backtest.mae)


def indistinguishable(backtest: Backtest, names: list[str], budget: int, best: str) -> list[str]:
    """Of ``names`` (in their order), those the backtest cannot tell apart from ``best`` at the
    ``budget``-th budget: behind it by at most :data:`SHARE_TOLERANCE` (``best`` among them)."""
    top = float(backtest.share(best)[budget])
    return [name for name in names if float(backtest.share(name)[budget]) >= top - SHARE_TOLERANCE]


def backtest_table(backtest: Backtest, kinds: dict[str, str]) -> pd.DataFrame:
    """One row per candidate: mean share over the budgets, the share at each budget
    (``share <budget>``), MAE, and its shortfall against the best baseline in tolerances."""
    rows = []
    for name in backtest.models:
        shares = backtest.share(name)
        rows.append({"model": name, "kind": kinds[name], "share": float(shares.mean()),
                     "mae": backtest.mae(name), "shortfall": shortfall(backtest, name),
                     **{f"share {b}": float(v) for b, v in zip(backtest.budgets, shares,
                                                               strict=True)}})  # fmt: skip
    return pd.DataFrame(rows)


def margin(backtest: Backtest, winner: str) -> dict[str, Any]:
    """The winner against the best baseline (other than itself, when it is one): per budget its
    share lead in points and that lead's noise (one standard error), and its MAE ratio and that
    ratio's noise."""
    names = [name for name in baseline_names(backtest) if name != winner] or [winner]
    per_budget = {}
    for i, budget in enumerate(backtest.budgets):
        best = max(names, key=lambda name: backtest.share(name)[i])
        lead = backtest.share(winner)[i] - backtest.share(best)[i]
        noise = backtest.share_noise(winner, best)[i] if winner != best else 0.0
        per_budget[budget] = {"baseline": best, "points": 100 * float(lead),
                              "noise_points": _finite(100 * float(noise))}  # fmt: skip
    best_mae = min(names, key=backtest.mae)
    scale = max(backtest.mae(best_mae), 1e-12)
    mae_noise = backtest.mae_noise(winner, best_mae) if winner != best_mae else 0.0
    return {"share": per_budget, "mae_baseline": best_mae,
            "mae_ratio": backtest.mae(winner) / scale,
            "mae_ratio_noise": _finite(mae_noise / scale),
            "origins": len(backtest.origins)}  # fmt: skip


def _row(row: dict[str, Any]) -> dict[str, Any]:
    return {key: value if isinstance(value, str) else _finite(value) for key, value in row.items()}


def _finite(value: float) -> float | None:
    """A JSON number (``None`` for an infinite or missing one: one origin has no noise)."""
    return float(value) if np.isfinite(value) else None
