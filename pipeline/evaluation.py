"""Walk-forward evaluation of hotness forecasts: what a warm-up at a fixed budget would have saved.

The input is the COUNTS SHAPE of :mod:`pipeline.windows` (one row per item and window with
``requests > 0``), turned into a dense item × window :class:`CountMatrix`. At each step ``t`` a
model sees windows ``0..t`` and scores the items seen so far; the top ``K`` items (or as many as
fit in ``B`` tokens) form the warmed set, and the step is judged on window ``t + 1``:

* captured share — next-window requests that fall on warmed items, over all next-window requests;
* oracle — the same for the true next-window top-K (nothing can do better);
* history oracle — the best top-K among items already seen (what any forecaster could reach);
* first uses — next-window items used at least once that were warmed: what a warm-up after a
  restart saves (an engine caches a prefix at its first use, so each used item counts once),
  with its own history oracle (as many used, seen items as the budget takes);
* MAE — mean absolute error of predicted counts over the seen items and the next window's items.

:func:`held_out_margins` states a model's standing against the best baseline in the run's own
noise: per budget its lead in points of the history oracle, with the standard error of the
paired window-by-window difference, and whether the held-out property holds (at least the best
baseline's share minus one point and two of those standard errors, MAE at most 2% above the
lowest baseline MAE).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

from pipeline.errors import BadInputError

COUNT_COLUMNS = ("item_kind", "item_key", "window_start", "requests")
TOKEN_COLUMNS = ("prompt_tokens", "output_tokens")
#: A dense matrix above this many cells is refused: pick a longer window or fewer items.
MAX_CELLS = 60_000_000
#: The held-out property: share of the history oracle at least the best baseline's minus
#: ``SHARE_SLACK`` and ``NOISE_SES`` standard errors of their paired difference across the
#: held-out windows; MAE at most ``1 + MAE_SLACK`` times the lowest baseline MAE.
SHARE_SLACK, NOISE_SES, MAE_SLACK = 0.01, 2.0, 0.02


@dataclass(frozen=True)
class WindowTiming:
    """Within-window timing and chain position of each item (the optional timing columns of
    :mod:`pipeline.windows`): what per-window counts lose."""

    last_offset: np.ndarray  # float32 (n_items, n_windows): last request's offset / window; NaN
    tail_requests: np.ndarray  # float32 (n_items, n_windows): requests in the window's tail
    leaf_requests: np.ndarray  # float32 (n_items, n_windows): requests ending at the item
    chain_depth: np.ndarray  # float32 (n_items,): smallest chain position (0 = head)


@dataclass(frozen=True, eq=False)
class CountMatrix:
    """Per-item request and token counts on a regular grid of windows (missing = 0).

    Compared and hashed by identity, so derived feature tables can be cached per matrix.
    """

    items: pd.DataFrame  # item_kind, item_key; row i is item i
    start: pd.Timestamp
    window: pd.Timedelta
    requests: np.ndarray  # float32 (n_items, n_windows)
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    first_seen: np.ndarray = field(repr=False)  # int64 (n_items,): first window with requests
    timing: WindowTiming | None = field(default=None, repr=False)  # when the counts carry it

    @property
    def n_items(self) -> int:
        return int(self.requests.shape[0])

    @property
    def n_windows(self) -> int:
        return int(self.requests.shape[1])

    def window_start(self, t: int) -> pd.Timestamp:
        """Start of window ``t`` (may lie past the last window)."""
        return self.start + t * self.window

    def seen_by(self, t: int) -> np.ndarray:
        """Indices of the items with requests in some window ``<= t``."""
        return np.flatnonzero(self.first_seen <= t)

    @classmethod
    def from_counts(
        cls,
        counts: pd.DataFrame,
        window: pd.Timedelta | None = None,
        kind: str | None = None,
        max_cells: int | None = None,
    ) -> CountMatrix:
        """Build the matrix from a counts table; ``kind`` keeps one item kind only; more than
        ``max_cells`` (:data:`MAX_CELLS`) items x windows is refused."""
        _check_counts(counts)
        if kind is not None:
            counts = counts[counts["item_kind"] == kind]
        if counts.empty:
            raise BadInputError("no item windows to learn from", where=f"counts(kind={kind})")
        starts = pd.to_datetime(counts["window_start"], utc=True)
        window = window if window is not None else infer_window(starts)
        origin = starts.min()
        column = ((starts - origin) // window).to_numpy(dtype=np.int64)
        keys = counts["item_kind"].astype(str) + "\x00" + counts["item_key"].astype(str)
        codes, uniques = pd.factorize(keys, sort=False)
        n_items, n_windows = len(uniques), int(column.max()) + 1
        limit = MAX_CELLS if max_cells is None else max_cells
        if n_items * n_windows > limit:
            raise BadInputError(
                f"{n_items} items x {n_windows} windows is too many cells (at most {limit:,}):"
                " use a longer window or a shorter span",
                where="counts",
            )
        items = pd.DataFrame(
            [key.split("\x00", 1) for key in uniques], columns=["item_kind", "item_key"]
        )
        grids = [_grid(counts, name, codes, column, (n_items, n_windows)) for name in _VALUES]
        first = _first_seen(grids[0])
        timing = _timing(counts, codes, column, (n_items, n_windows), window)
        return cls(items, origin, window, grids[0], grids[1], grids[2], first, timing)


_VALUES = ("requests", *TOKEN_COLUMNS)
TIMING_COLUMNS = ("last_offset_s", "tail_requests", "chain_depth", "leaf_requests")


def _timing(
    counts: pd.DataFrame,
    codes: np.ndarray,
    column: np.ndarray,
    shape: tuple[int, int],
    window: pd.Timedelta,
) -> WindowTiming | None:
    """The timing grids when ``counts`` has every timing column, else ``None``."""
    if any(name not in counts.columns for name in TIMING_COLUMNS):
        return None
    offset = np.full(shape, np.nan, dtype=np.float32)
    seconds = pd.to_numeric(counts["last_offset_s"], errors="coerce").to_numpy(np.float32)
    offset[codes, column] = seconds / np.float32(window.total_seconds())
    depth = np.full(shape[0], np.inf, dtype=np.float32)
    np.minimum.at(depth, codes, counts["chain_depth"].to_numpy(np.float32))
    return WindowTiming(
        last_offset=offset,
        tail_requests=_grid(counts, "tail_requests", codes, column, shape),
        leaf_requests=_grid(counts, "leaf_requests", codes, column, shape),
        chain_depth=depth,
    )


def _check_counts(counts: pd.DataFrame) -> None:
    missing = [name for name in COUNT_COLUMNS if name not in counts.columns]
    if missing:
        raise BadInputError(f"missing column(s) {', '.join(missing)}", where="counts")


def latest_windows_that_fit(
    counts: pd.DataFrame, kind: str | None = None, max_cells: int | None = None
) -> tuple[pd.DataFrame, int]:
    """The rows of ``counts`` (of ``kind``) in its latest windows whose items (those seen in
    them) times windows fit a matrix of ``max_cells`` (:data:`MAX_CELLS`), and how many of its
    windows were left out (0: all of it fits). A busy fleet's history outgrows the limit in
    hours (a generated Mooncake-class trace of 3 hours in 1-minute windows: 66 million cells),
    and the selection backtests the latest windows only. A table whose last window alone does
    not fit is returned whole (:meth:`CountMatrix.from_counts` refuses it)."""
    limit = MAX_CELLS if max_cells is None else max_cells
    _check_counts(counts)
    if kind is not None:
        counts = counts[counts["item_kind"] == kind]
    starts = pd.to_datetime(counts["window_start"], utc=True).dt.tz_convert(None)
    ns = starts.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    distinct = np.unique(ns)
    if len(distinct) < 2:
        return counts, 0
    window = int(np.diff(distinct).min())
    where = np.searchsorted(distinct, ns)
    keys = counts["item_kind"].astype(str) + "\x00" + counts["item_key"].astype(str)
    last_seen = pd.Series(where).groupby(keys.to_numpy()).max().to_numpy()
    # items seen in windows i.. of the distinct starts: those last seen at i or later
    items_from = np.cumsum(np.bincount(last_seen, minlength=len(distinct))[::-1])[::-1]
    columns = (distinct[-1] - distinct) // window + 1
    fits = np.flatnonzero(items_from * columns <= limit)
    if len(fits) == 0 or fits[0] == 0:
        return counts, 0
    first = int(fits[0])
    return counts[where >= first], first


def infer_window(starts: pd.Series) -> pd.Timedelta:
    """The window length of a counts table: the smallest gap between distinct window starts."""
    distinct = np.sort(starts.unique())
    if len(distinct) < 2:
        raise BadInputError("one window only; pass the window length", where="counts.window_start")
    return pd.Timedelta(np.diff(distinct).min())


def _grid(
    counts: pd.DataFrame, name: str, codes: np.ndarray, column: np.ndarray, shape: tuple[int, int]
) -> np.ndarray:
    grid = np.zeros(shape, dtype=np.float32)
    if name in counts.columns:
        values = pd.to_numeric(counts[name], errors="coerce").fillna(0).to_numpy(np.float32)
        np.add.at(grid, (codes, column), values)
    return grid


def _first_seen(requests: np.ndarray) -> np.ndarray:
    active = requests > 0
    first = active.argmax(axis=1).astype(np.int64)
    first[~active.any(axis=1)] = requests.shape[1]
    return first


class HotnessPredictor(Protocol):
    """What walk-forward needs of a model (baselines and the forecaster alike)."""

    def fit(self, matrix: CountMatrix, until: int) -> object:
        """Learn from windows ``0..until`` (targets up to and including ``until``)."""
        ...

    def predict_at(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray:
        """Predicted requests of ``items`` in window ``t + horizon``, from windows ``0..t``."""
        ...


@dataclass(frozen=True)
class WalkForwardConfig:
    """Budgets and schedule of a walk-forward run.

    Each of ``budget_items`` is judged (one model prediction serves them all); ``budget_tokens``
    adds budgets in tokens, where items are taken by score while their cost (mean prompt tokens
    per request so far) fits. ``first_t`` is the first history end (default: a quarter of the
    windows, at least 2), ``last_t`` the last (default: the last with a target); models are
    refit every ``refit_every`` steps. Each step ``t`` is judged on window ``t + horizon``.
    """

    budget_items: tuple[int, ...] = (100,)
    budget_tokens: tuple[int, ...] = ()
    first_t: int | None = None
    refit_every: int = 1
    horizon: int = 1
    last_t: int | None = None

    def budgets(self) -> list[tuple[str, int | None, int | None]]:
        """(label, items, tokens) for each budget."""
        items = [(f"{k} items", k, None) for k in self.budget_items]
        return items + [(f"{b} tokens", None, b) for b in self.budget_tokens]


@dataclass(frozen=True)
class Evaluation:
    """A walk-forward result: ``table`` per model, ``steps`` per model and step, ``notes``
    (e.g. which model the backtest selected) and ``selection``, the last selection's report
    (its backtest table and margin) when a selected model ran."""

    table: pd.DataFrame
    steps: pd.DataFrame
    notes: tuple[str, ...] = ()
    selection: dict[str, Any] | None = None


def walk_forward(
    matrix: CountMatrix,
    models: Mapping[str, HotnessPredictor],
    config: WalkForwardConfig = WalkForwardConfig(),
) -> Evaluation:
    """Train on windows up to ``t``, predict ``t + 1``, judge, slide; see the module docstring."""
    first_t = config.first_t if config.first_t is not None else max(2, matrix.n_windows // 4)
    last_t = matrix.n_windows - 1 - config.horizon
    last_t = last_t if config.last_t is None else min(last_t, config.last_t)
    if first_t > last_t:
        raise BadInputError(
            f"{matrix.n_windows} windows leave nothing to test after the first {first_t + 1}",
            where="window",
        )
    rows: list[dict[str, object]] = []
    for step, t in enumerate(range(first_t, last_t + 1)):
        if step % max(1, config.refit_every) == 0:
            for model in models.values():
                model.fit(matrix, t)
        rows.extend(_judge_step(matrix, models, config, t))
    steps = pd.DataFrame(rows)
    return Evaluation(table=summarise(steps), steps=steps)


def _judge_step(
    matrix: CountMatrix,
    models: Mapping[str, HotnessPredictor],
    config: WalkForwardConfig,
    t: int,
) -> list[dict[str, object]]:
    target = t + config.horizon
    actual = matrix.requests[:, target].astype(np.float64)
    seen = matrix.seen_by(t)
    scored = np.flatnonzero((matrix.first_seen <= t) | (actual > 0))  # sorted, as union1d gives
    predictions = {
        name: _predicted(matrix, model, t, seen, config.horizon) for name, model in models.items()
    }
    cost = _item_cost(matrix, t, target)
    used = (actual > 0).astype(np.float64)
    rows = []
    for label, items, tokens in config.budgets():
        pick = _picker(items, tokens, cost)
        base = {
            "budget": label,
            "t": t,
            "window_start": matrix.window_start(target),
            "total": float(actual.sum()),
            "oracle": float(actual[pick(np.arange(matrix.n_items), actual)].sum()),
            "history_oracle": float(actual[pick(seen, actual[seen])].sum()),
            "first_use_oracle": float((actual[pick(seen, used[seen])] > 0).sum()),
        }
        for name, predicted in predictions.items():
            warmed = pick(seen, predicted[seen])
            rows.append(
                {
                    **base,
                    "model": name,
                    "captured": float(actual[warmed].sum()),
                    "first_uses": float((actual[warmed] > 0).sum()),
                    "abs_error": float(np.abs(predicted[scored] - actual[scored]).sum()),
                    "n_scored": len(scored),
                }
            )
    return rows


def _predicted(
    matrix: CountMatrix, model: HotnessPredictor, t: int, seen: np.ndarray, horizon: int = 1
) -> np.ndarray:
    """Predictions for every item (0 for items not seen yet)."""
    predicted = np.zeros(matrix.n_items)
    if horizon == 1:  # the protocol's default: models written before horizons still fit
        values = model.predict_at(matrix, t, seen)
    else:
        values = model.predict_at(matrix, t, seen, horizon)
    predicted[seen] = np.asarray(values, dtype=np.float64)
    return predicted


def _item_cost(matrix: CountMatrix, t: int, target: int) -> np.ndarray:
    """Mean prompt tokens per request of each item: up to ``t`` if seen, else in ``target``."""
    past_requests = matrix.requests[:, : t + 1].sum(axis=1)
    past = matrix.prompt_tokens[:, : t + 1].sum(axis=1) / np.maximum(past_requests, 1)
    upcoming = matrix.prompt_tokens[:, target] / np.maximum(matrix.requests[:, target], 1)
    return np.where(past_requests > 0, past, upcoming)


def _picker(
    items: int | None, tokens: int | None, cost: np.ndarray
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """A function choosing the warmed items among ``candidates`` from their ``scores``."""

    def pick(candidates: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if tokens is None and items is not None and 0 < items < len(candidates):
            return candidates[_top(scores, items)]
        order = candidates[np.argsort(-scores, kind="stable")]
        if tokens is None:
            return order[:items]
        # Greedy by score: the best items while their total cost fits.
        return order[np.cumsum(cost[order]) <= tokens]

    return pick


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` highest scores, ties taken by position (what a stable sort gives)
    — a partition instead of a sort of ~180,000 scores. The negated scores are partitioned at
    ``k``: numpy's partition at ``n - k`` of scores that are mostly equal (zeros, small counts)
    took 15-20 times as long, and was half of a selection's time."""
    kth = -np.partition(-scores, k - 1)[k - 1]
    above = np.flatnonzero(scores > kth)
    return np.concatenate([above, np.flatnonzero(scores == kth)[: k - len(above)]])


def summarise(steps: pd.DataFrame) -> pd.DataFrame:
    """Per budget and model, over all steps: captured share, shares of both oracles, MAE."""
    grouped = steps.groupby(["budget", "model"], sort=False)[
        [
            "total",
            "oracle",
            "history_oracle",
            "captured",
            "abs_error",
            "n_scored",
            "first_uses",
            "first_use_oracle",
        ]
    ].sum()
    table = pd.DataFrame(
        {
            "captured_share": grouped["captured"] / grouped["total"],
            "share_of_history_oracle": grouped["captured"] / grouped["history_oracle"],
            "share_of_oracle": grouped["captured"] / grouped["oracle"],
            "mae": grouped["abs_error"] / grouped["n_scored"],
            "first_use_share_of_history_oracle": grouped["first_uses"]
            / grouped["first_use_oracle"],
            "history_oracle_share": grouped["history_oracle"] / grouped["total"],
            "oracle_share": grouped["oracle"] / grouped["total"],
        }
    )
    return table.reset_index()


def coarsen_counts(counts: pd.DataFrame, window: pd.Timedelta) -> pd.DataFrame:
    """Counts summed into longer windows (``window`` a multiple of the table's own)."""
    _check_counts(counts)
    own = infer_window(pd.to_datetime(counts["window_start"], utc=True))
    if window == own:
        return counts
    if window < own or window % own != pd.Timedelta(0):
        raise BadInputError(f"cannot turn {own} windows into {window} ones", where="window")
    frame = counts.copy()
    frame["window_start"] = pd.to_datetime(frame["window_start"], utc=True).dt.floor(window)
    values = [c for c in ("requests", *TOKEN_COLUMNS) if c in frame.columns]
    summed = frame.groupby(["item_kind", "item_key", "window_start"], observed=True)[values].sum()
    return summed.reset_index()


def standard_error(per_step: np.ndarray) -> np.ndarray:
    """Standard error of a sum over steps (last axis): sqrt(n) x the steps' spread (infinite
    with one step: nothing to tell noise from)."""
    n = per_step.shape[-1]
    if n < 2:
        return np.full(per_step.shape[:-1], np.inf)
    return np.sqrt(n) * per_step.std(axis=-1, ddof=1)


def held_out_margins(steps: pd.DataFrame, model: str, baselines: Collection[str]) -> pd.DataFrame:
    """Per budget of a walk-forward's ``steps``: ``model`` against the best of ``baselines``
    there — ``margin`` (its share of the history oracle minus the best baseline's, in points),
    ``se`` (the standard error of that margin from the window-by-window difference in captured
    requests, in points), ``bound`` (the least margin the property allows: minus one point and
    two standard errors), ``mae_ratio`` to the lowest baseline MAE, and whether each part and
    the whole property hold. A ``model`` or no baseline missing from ``steps`` is bad input."""
    _check_margins_input(steps, model, baselines)
    rows = []
    for budget, part in steps.groupby("budget", sort=False):
        captured = part.pivot_table(index="t", columns="model", values="captured", sort=True)
        oracle = max(float(part.groupby("t")["history_oracle"].first().sum()), 1e-12)
        errors = part.groupby("model")[["abs_error", "n_scored"]].sum()
        mae = errors["abs_error"] / errors["n_scored"].clip(lower=1)
        names = [name for name in baselines if name in captured.columns]
        best = max(names, key=lambda name: float(captured[name].sum()))
        lowest = min(names, key=lambda name: float(mae[name]))
        difference = (captured[model] - captured[best]).to_numpy()[None, :]
        margin = 100 * float(difference.sum()) / oracle
        se = 100 * float(standard_error(difference)[0]) / oracle
        bound = -(100 * SHARE_SLACK + NOISE_SES * se)
        ratio = float(mae[model]) / max(float(mae[lowest]), 1e-12)
        rows.append({"budget": budget, "baseline": best, "margin": margin, "se": se,
                     "bound": bound, "share_ok": margin >= bound, "mae_ratio": ratio,
                     "mae_baseline": lowest, "mae_ok": ratio <= 1 + MAE_SLACK})  # fmt: skip
    table = pd.DataFrame(rows)
    return table.assign(holds=table["share_ok"] & table["mae_ok"])


def _check_margins_input(steps: pd.DataFrame, model: str, baselines: Collection[str]) -> None:
    missing = [c for c in ("budget", "t", "model", "captured", "history_oracle", "abs_error",
                           "n_scored") if c not in steps.columns]  # fmt: skip
    if missing:
        raise BadInputError(f"missing column(s) {', '.join(missing)}", where="steps")
    models = set(steps["model"])
    if model not in models:
        raise BadInputError(f"no steps of {model!r} to compare", where="steps.model")
    if not models.intersection(baselines):
        raise BadInputError(f"none of the baselines {sorted(baselines)} in the steps",
                            where="steps.model")  # fmt: skip
