"""Choosing the hotness model by backtest, so the one in use never loses to a baseline.

On every fit, :class:`SelectedForecaster` scores candidates — the baselines, blends of them, the
tiered rankings, and LightGBM with each of its objectives — by a rolling-origin backtest
(:mod:`models.backtest`): every history end of the backtest is an origin, each candidate
(refitted every few origins, and once more at the last one) predicts the window after it, and
the span reaches back over the latest ``backtest`` origins (:data:`MAX_ORIGINS` by default): a
size in work, not seconds, so the same history and settings give the same choice at any load.
The score is what the planner cares about, at
every budget the plans use: the captured share of the history oracle (:mod:`pipeline.evaluation`),
in requests (``metric="requests"``, what a warm cache serves window after window) or in first
uses (``metric="first_uses"``: what a warm-up after a restart saves), and the MAE.

The baselines often disagree — one ranks the hottest few best, another the next hundreds, a
third counts best — and then no single one of them holds against all three. So once the simple
candidates are scored, the tiered rankings (:mod:`models.tiered`, :func:`with_tiered`) join
them, scored on the same origins. Where the history is long enough for LightGBM, the simple
candidates are backtested once more from :data:`FIRST_TIER_ORIGIN` on (more origins than
LightGBM's span: less noise), and each item budget's top items are ranked by the simplest
simple candidate within one standard error of the best one at that budget there (the
one-standard-error rule, :func:`models.tiered.tier_rankers`), the rest as by the one with the
lowest MAE. With a shorter history they rank as the simple candidate the choice keeps; when
none holds (and the backtest has the origins a learner needs: tiers are learned from it), in
tiers by the simplest candidate within half a point of the best one.
``tiered`` predicts those rankers' own counts, ``tiered_calibrated`` the median count their
scores saw next window on the latest history. A share depends only on the ranking, an MAE only
on the counts, so these keep each baseline where it is best.

The choice (:func:`choose`) generalises rather than chases the backtest's luck:

1. a candidate that loses to the best baseline is never chosen: one whose share at some budget
   is below that budget's best baseline by more than half a point, or whose MAE is above the
   lowest baseline MAE by more than 1% (:func:`shortfall`); when every candidate does, the one
   nearest to holding wins;
2. of the others, the simplest (the order of :func:`candidate_models`; the tiered rankings
   last: their tiers come from the same origins) is kept unless a later one is better by more
   than the backtest's own noise — one standard error of their paired difference across
   origins (the one-standard-error rule) — at some budget or in MAE, and worse by more than it
   nowhere (:func:`beats`).

On a short history (fewer than ``short_history`` windows: where prewarm starts on every new
engine) the backtest's few origins cannot vouch for anything learned: LightGBM does not compete,
and the winner ranks each item budget as the baseline the backtest cannot tell apart from the
best one there (the simplest within half a point or one standard error, of those that score at
least that many items above zero at the last origin: the last window cannot rank the
thousandth block of a window that saw 300), one baseline where one holds at every budget, with
counts calibrated as the tiered rankings' are (:func:`baseline_tiers`,
:func:`with_calibrated`). On the generated shared-heads traces in 1-minute windows, an
uncalibrated baseline's MAE went up to 10% over the lowest baseline's on later windows, and
the last window at 1,000 blocks lost 6 points. The note says so.

The winner does the predicting as the backtest scored it: the very candidate fitted at the
backtest's last origin (its tiers, rankers and weights learned once, on the history up to that
origin), not a refit that could rank otherwise. The backtest table and the winner's margin over
the best baseline go with it into the saved model's metadata (:func:`selection_metadata`),
where the planner and ``prewarm status`` read them back (:func:`load_selected`,
:func:`saved_selection`).

With too little history for LightGBM to learn from (fewer than ``min_learning_windows`` windows
before the first origin, or too few origins after them) only the baselines, blends and tiered
rankings compete, and the report says so. The tiered rankings need item budgets (token budgets
alone: they do not compete) and add their own backtest on the same origins (simple models only).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from models.backtest import METRIC_COLUMNS, Backtest, BacktestPlan, plan_backtest, run_backtest
from models.baselines import HotnessModel, _until, baselines, simple_models
from models.features import FEATURE_NAMES, windows_per_day
from models.persistence import ModelState, load_model, read_saved
from models.tiered import TieredRanking, tier_rankers
from pipeline.errors import BadInputError
from pipeline.evaluation import CountMatrix

#: The tiered rankings (:class:`models.tiered.TieredRanking`) by name: calibrated counts or not.
TIERED = {"tiered": False, "tiered_calibrated": True}
#: LightGBM objectives tried on every selection.
OBJECTIVES = ("poisson", "tweedie", "median")
#: The moving average's share in the blend candidate (LightGBM ``median`` and the average).
BLEND_SHARE = 0.5
#: The metadata key (under ``extra``) of a saved model's selection report.
SELECTION_KEY = "selection"
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
#: A short history's tier goes to a baseline within the noise of the best only where it scores
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
    tell apart from the best one there — within the larger of :data:`SHARE_TOLERANCE` and one
    standard error of their paired difference (the one-standard-error rule) — where it ranks
    :data:`RANK_DEPTH` times that many items or as many as the deepest one (``ranks[name]``:
    the items it scores above zero at the last origin; past them it ranks by position), a
    shallower one only as the best (on a tie, the best over every budget, then the lowest MAE);
    and the rest's the baseline with the lowest MAE."""
    names = baseline_names(backtest)
    overall = {name: (float(backtest.share(name).mean()), -backtest.mae(name)) for name in names}
    tiers: list[str] = []
    for budget in budgets:
        i = backtest.budgets.index(f"{budget} items")
        # On a tie (every one takes all a window's items), the best over every budget.
        best = max(names, key=lambda name: (float(backtest.share(name)[i]), *overall[name]))
        depth = min(RANK_DEPTH * budget, max(ranks.get(name, 0) for name in names))
        deep = [name for name in names if ranks.get(name, 0) >= depth]
        tiers.extend(tier_rankers(backtest, deep, (budget,), SHARE_TOLERANCE, NOISE_SES)
                     if best in deep else (best,))  # fmt: skip
    return tuple(tiers), min(names, key=backtest.mae)


def with_calibrated(
    matrix: CountMatrix,
    models: dict[str, HotnessModel],
    scored: Backtest,
    plan: BacktestPlan,
    selected: SelectedForecaster,
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
    selected: SelectedForecaster,
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


def _row(row: dict[str, Any]) -> dict[str, Any]:
    return {key: value if isinstance(value, str) else _finite(value) for key, value in row.items()}


def _finite(value: float) -> float | None:
    """A JSON number (``None`` for an infinite or missing one: one origin has no noise)."""
    return float(value) if np.isfinite(value) else None


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
