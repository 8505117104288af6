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
best one there (the simplest within half a point of it, of those that score at least twice
that many items above zero at the last origin: the last window cannot rank the thousandth
block of a window that saw 300), one baseline where one
holds at every budget, with counts calibrated as the tiered rankings' are (:func:`baseline_tiers`,
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

The modules: :mod:`models.selection.rules` (the candidates and the rules of the choice),
:mod:`models.selection.candidates` (the tiered rankings and a short history's baseline tiers,
joined to the backtest), :mod:`models.selection.forecaster` (:class:`SelectedForecaster`) and
:mod:`models.selection.saved` (the saved winner and its report); this package exports them.
"""

from models.selection.candidates import with_calibrated, with_tiered
from models.selection.forecaster import SelectedForecaster
from models.selection.rules import (
    BLEND_SHARE,
    FIRST_TIER_ORIGIN,
    MAE_TOLERANCE,
    MAX_ORIGINS,
    MAX_REFITS,
    MAX_TIER_ORIGINS,
    METRICS,
    MIN_LEARNING_ORIGINS,
    NOISE_SES,
    OBJECTIVES,
    RANK_DEPTH,
    SHARE_TOLERANCE,
    SHORT_HISTORY,
    TIERED,
    backtest_table,
    baseline_names,
    baseline_tiers,
    beats,
    candidate_models,
    choose,
    margin,
    shortfall,
    simplest_unbeaten,
)
from models.selection.saved import (
    SELECTION_KEY,
    SavedForecaster,
    load_selected,
    saved_selection,
    selection_metadata,
    winner_table,
)

__all__ = [
    "BLEND_SHARE",
    "FIRST_TIER_ORIGIN",
    "MAE_TOLERANCE",
    "MAX_ORIGINS",
    "MAX_REFITS",
    "MAX_TIER_ORIGINS",
    "METRICS",
    "MIN_LEARNING_ORIGINS",
    "NOISE_SES",
    "OBJECTIVES",
    "RANK_DEPTH",
    "SELECTION_KEY",
    "SHARE_TOLERANCE",
    "SHORT_HISTORY",
    "TIERED",
    "SavedForecaster",
    "SelectedForecaster",
    "backtest_table",
    "baseline_names",
    "baseline_tiers",
    "beats",
    "candidate_models",
    "choose",
    "load_selected",
    "margin",
    "saved_selection",
    "selection_metadata",
    "shortfall",
    "simplest_unbeaten",
    "winner_table",
    "with_calibrated",
    "with_tiered",
]
