"""Sliding-window features of an item's past, for predicting its requests in the next window.

Every feature of ``(item, t)`` reads windows ``0..t`` only, so a walk-forward run never peeks.
The per-matrix running tables (EWMA, cumulative sums, last-seen index) are built once and cached
by matrix identity: a walk-forward run asks for the features of dozens of steps of one matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from pipeline.evaluation import CountMatrix

ITEM_KINDS = ("prefix", "prompt", "template", "adapter", "tenant", "model")
LAGS = 6
ROLL = 12  # windows in the rolling mean/std/max
SEASON_DAYS = 7
EWMA_FAST, EWMA_SLOW = 0.3, 0.1  # fast = the best baseline on Mooncake; the forecast margin

# Features also given divided by the item's fast EWMA, so one tree split means the same shape
# at 5 requests a window and at 50,000.
_RELATIVE_TO_LEVEL = ("lag_0", "lag_1", "lag_2", "mean_3", "mean_12", "max_12", "std_12",
                      "season_1", "season_2", "season_mean", "hour_mean")  # fmt: skip

# The item's day learned from its whole history (NaN until it has more than a day of it): its
# mean at the target's hour of day and on the target's day of week, as ratios to its overall
# mean, and the same hour ratio now; their quotient says where the day is taking it.
PROFILE_FEATURES = ("hour_mean", "hour_profile", "hour_profile_now", "weekday_profile")

# From the optional timing columns (NaN without them): within-window recency separates a block
# whose conversation just spoke from one whose last turn was minutes ago in the same count.
TIMING_FEATURES = ("recency", "tail_0", "tail_share_0", "chain_depth", "leaf_share", "leaf_share_0")

FEATURE_NAMES: tuple[str, ...] = (
    *(f"lag_{k}" for k in range(LAGS)),
    "mean_3",
    f"mean_{ROLL}",
    f"std_{ROLL}",
    f"max_{ROLL}",
    "mean_since_first",
    "ewma_fast",
    "ewma_slow",
    "active_windows",
    "age",
    "since_last",
    "mean_interval",
    "since_last_over_interval",
    "season_1",
    "season_2",
    "season_mean",
    "tod_sin",
    "tod_cos",
    "dow_sin",
    "dow_cos",
    *PROFILE_FEATURES,
    "total_0",
    "share_0",
    "prompt_per_request",
    "output_per_request",
    "item_kind",
    *TIMING_FEATURES,
    *(f"{name}_rel" for name in _RELATIVE_TO_LEVEL),
)
CATEGORICAL = ("item_kind",)


@dataclass(frozen=True)
class RunningTables:
    """Running per-item state after each window (all arrays (n_items, n_windows))."""

    ewma_fast: np.ndarray
    ewma_slow: np.ndarray
    cum_requests: np.ndarray
    cum_prompt: np.ndarray
    cum_output: np.ndarray
    cum_active: np.ndarray
    last_seen: np.ndarray  # int32; -1 before the first request
    totals: np.ndarray  # (n_windows,) requests of all items
    kind_codes: np.ndarray  # (n_items,)
    last_offset: np.ndarray | None  # offset / window of the last request up to each window
    cum_leaf: np.ndarray | None


@lru_cache(maxsize=2)
def running_tables(matrix: CountMatrix) -> RunningTables:
    """The running tables of ``matrix`` (cached: the two most recent matrices)."""
    req = matrix.requests
    active = req > 0
    index = np.arange(matrix.n_windows, dtype=np.int32)
    last = np.maximum.accumulate(np.where(active, index, -1).astype(np.int32), axis=1)
    kinds = {kind: code for code, kind in enumerate(ITEM_KINDS)}
    codes = matrix.items["item_kind"].map(kinds).fillna(len(ITEM_KINDS)).to_numpy(np.float32)
    return RunningTables(
        ewma_fast=ewma(req, EWMA_FAST),
        ewma_slow=ewma(req, EWMA_SLOW),
        cum_requests=np.cumsum(req, axis=1, dtype=np.float32),
        cum_prompt=np.cumsum(matrix.prompt_tokens, axis=1, dtype=np.float32),
        cum_output=np.cumsum(matrix.output_tokens, axis=1, dtype=np.float32),
        cum_active=np.cumsum(active, axis=1, dtype=np.float32),
        last_seen=last,
        totals=req.sum(axis=0),
        kind_codes=codes,
        last_offset=_carried_offset(matrix, last),
        cum_leaf=(
            np.cumsum(matrix.timing.leaf_requests, axis=1, dtype=np.float32)
            if matrix.timing is not None
            else None
        ),
    )


def _carried_offset(matrix: CountMatrix, last: np.ndarray) -> np.ndarray | None:
    """Offset (in windows) of each item's last request within its last active window."""
    if matrix.timing is None:
        return None
    rows = np.arange(matrix.n_items)[:, None]
    carried = matrix.timing.last_offset[rows, np.maximum(last, 0)]
    return np.where(last >= 0, carried, np.nan).astype(np.float32)


def ewma(series: np.ndarray, alpha: float) -> np.ndarray:
    """Exponentially weighted mean along windows, started at an item's first window."""
    out = np.empty_like(series, dtype=np.float32)
    level = np.zeros(series.shape[0], dtype=np.float32)
    started = np.zeros(series.shape[0], dtype=bool)
    for t in range(series.shape[1]):
        column = series[:, t]
        started |= column > 0
        level = np.where(started, alpha * column + (1 - alpha) * level, 0.0).astype(np.float32)
        out[:, t] = level
    return out


def windows_per_day(window: pd.Timedelta) -> int | None:
    """Windows in a day when the window divides a day evenly, else ``None`` (no season)."""
    day = pd.Timedelta(days=1)
    if window <= pd.Timedelta(0) or day % window != pd.Timedelta(0):
        return None
    return int(day // window)


def candidates(matrix: CountMatrix, t: int, lookback: int | None = None) -> np.ndarray:
    """Items a forecast at ``t`` considers: seen by ``t`` (within ``lookback`` windows if set)."""
    seen = matrix.seen_by(t)
    if lookback is None:
        return seen
    last = running_tables(matrix).last_seen[seen, t]
    return seen[t - last < lookback]


def features_at(matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1) -> np.ndarray:
    """Feature rows (len(items), len(FEATURE_NAMES)) of ``items`` at history end ``t``, for
    predicting window ``t + horizon`` (read-only: the latest few are shared between callers).

    A backtest asks for the same rows once per LightGBM objective, so the last
    :data:`_RECENT_ROWS` results are kept (by matrix identity, ``t``, horizon and items).
    """
    key = (id(matrix), t, horizon, hash(np.ascontiguousarray(items).tobytes()))
    cached = _recent_rows.get(key)
    if cached is not None and cached[0] is matrix:
        return cached[1]
    rows = _compute_features(matrix, t, items, horizon)
    rows.flags.writeable = False
    _recent_rows[key] = (matrix, rows)
    while len(_recent_rows) > _RECENT_ROWS:
        del _recent_rows[next(iter(_recent_rows))]
    return rows


_RECENT_ROWS = 2
_recent_rows: dict[tuple[int, int, int, int], tuple[CountMatrix, np.ndarray]] = {}


def _compute_features(matrix: CountMatrix, t: int, items: np.ndarray, horizon: int) -> np.ndarray:
    tables = running_tables(matrix)
    columns = [
        *_lag_features(matrix, t, items),
        *_history_features(matrix, tables, t, items),
        *_season_features(matrix, t, items, horizon),
        *_calendar_features(matrix, t + horizon - 1, len(items)),
        *profile_features(matrix, t, items, horizon),
        *_context_features(matrix, tables, t, items),
        *_timing_features(matrix, tables, t, items),
    ]
    # One preallocated block instead of column_stack: ~180,000 rows a call on Mooncake.
    rows = np.empty((len(items), len(FEATURE_NAMES)), dtype=np.float32)
    for j, column in enumerate(columns):
        rows[:, j] = column
    _fill_relative(rows, len(columns))
    return rows


_RELATIVE = [FEATURE_NAMES.index(name) for name in _RELATIVE_TO_LEVEL]


def _fill_relative(rows: np.ndarray, first: int) -> None:
    """Fill columns ``first..`` with features divided by the item's fast EWMA: shapes
    comparable across volumes."""
    level = rows[:, FEATURE_NAMES.index("ewma_fast")] + np.float32(0.05)
    rows[:, first:] = rows[:, _RELATIVE] / level[:, None]


def _lag_features(matrix: CountMatrix, t: int, items: np.ndarray) -> list[np.ndarray]:
    lo = max(0, t - ROLL + 1)
    recent = matrix.requests[items, lo : t + 1]
    recent = np.pad(recent, ((0, 0), (ROLL - recent.shape[1], 0)))  # zeros before the start
    lags = [recent[:, -1 - k] for k in range(LAGS)]
    span = min(ROLL, t + 1)
    window = recent[:, -span:]
    return [
        *lags,
        recent[:, -3:].sum(axis=1) / min(3, t + 1),
        window.mean(axis=1),
        window.std(axis=1),
        window.max(axis=1),
    ]


def _history_features(
    matrix: CountMatrix, tables: RunningTables, t: int, items: np.ndarray
) -> list[np.ndarray]:
    first = matrix.first_seen[items]
    age = np.maximum(t - first, 0).astype(np.float32)
    active = tables.cum_active[items, t]
    since_last = (t - tables.last_seen[items, t]).astype(np.float32)
    interval = age / np.maximum(active - 1, 1)
    return [
        tables.cum_requests[items, t] / (age + 1),
        tables.ewma_fast[items, t],
        tables.ewma_slow[items, t],
        active,
        age,
        since_last,
        interval,
        since_last / np.maximum(interval, 1),
    ]


def _season_features(
    matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
) -> list[np.ndarray]:
    period = windows_per_day(matrix.window)
    nan = np.full(len(items), np.nan, dtype=np.float32)
    if period is None:
        return [nan, nan, nan]
    past = [t + horizon - day * period for day in range(1, SEASON_DAYS + 1)]
    values = [matrix.requests[items, w] if 0 <= w <= t else nan for w in past]
    known = [v for v, w in zip(values, past, strict=True) if 0 <= w <= t]
    mean = np.mean(known, axis=0) if known else nan
    return [values[0], values[1], mean]


def _calendar_features(matrix: CountMatrix, t: int, n: int) -> list[np.ndarray]:
    target = matrix.window_start(t + 1)
    day_fraction = (target.hour * 3600 + target.minute * 60 + target.second) / 86400
    week_fraction = (target.day_of_week + day_fraction) / 7
    values = [
        np.sin(2 * np.pi * day_fraction),
        np.cos(2 * np.pi * day_fraction),
        np.sin(2 * np.pi * week_fraction),
        np.cos(2 * np.pi * week_fraction),
    ]
    return [np.full(n, value, dtype=np.float32) for value in values]


def _context_features(
    matrix: CountMatrix, tables: RunningTables, t: int, items: np.ndarray
) -> list[np.ndarray]:
    total = np.full(len(items), tables.totals[t], dtype=np.float32)
    requests = np.maximum(tables.cum_requests[items, t], 1)
    return [
        total,
        matrix.requests[items, t] / np.maximum(total, 1),
        tables.cum_prompt[items, t] / requests,
        tables.cum_output[items, t] / requests,
        tables.kind_codes[items],
    ]


def _timing_features(
    matrix: CountMatrix, tables: RunningTables, t: int, items: np.ndarray
) -> list[np.ndarray]:
    timing = matrix.timing
    if timing is None or tables.last_offset is None or tables.cum_leaf is None:
        return [np.full(len(items), np.nan, dtype=np.float32)] * len(TIMING_FEATURES)
    # Windows from the last request to the end of window t (0.1 = in the last tenth of it).
    recency = (t - tables.last_seen[items, t]) + 1 - tables.last_offset[items, t]
    last = np.maximum(matrix.requests[items, t], 1)
    tail = timing.tail_requests[items, t]
    leaf = timing.leaf_requests[items, t]
    total = np.maximum(tables.cum_requests[items, t], 1)
    return [
        recency,
        tail,
        tail / last,
        timing.chain_depth[items],
        tables.cum_leaf[items, t] / total,
        leaf / last,
    ]


@dataclass(frozen=True)
class BinnedSums:
    """Running sums of each item's requests within calendar bins (hour of day, day of week).

    Bin ``b``'s windows are ``columns[b]``; ``sums[b][:, j]`` is the sum over its first
    ``j + 1`` windows. Together the bins hold one number per matrix cell.
    """

    bins: np.ndarray  # (n_windows,) the bin of each window
    columns: list[np.ndarray]
    sums: list[np.ndarray]

    def mean_by(self, items: np.ndarray, t: int, b: int) -> tuple[np.ndarray, int]:
        """Mean requests of ``items`` over bin ``b``'s windows up to ``t``, and their number."""
        n = int(np.searchsorted(self.columns[b], t, side="right"))
        if n == 0:
            return np.full(len(items), np.nan, dtype=np.float32), 0
        return self.sums[b][items, n - 1] / n, n


@dataclass(frozen=True)
class CalendarTables:
    """Hour-of-day and day-of-week running sums of a matrix spanning more than a day."""

    hours: BinnedSums
    weekdays: BinnedSums
    per_day: int  # windows in a day


def _binned(requests: np.ndarray, bins: np.ndarray, n_bins: int) -> BinnedSums:
    columns = [np.flatnonzero(bins == b) for b in range(n_bins)]
    sums = [np.cumsum(requests[:, c], axis=1, dtype=np.float32) for c in columns]
    return BinnedSums(bins, columns, sums)


@lru_cache(maxsize=2)
def calendar_tables(matrix: CountMatrix) -> CalendarTables | None:
    """The calendar sums of ``matrix``, or ``None`` when its windows do not span a day or are
    a day or longer (no hour of day to learn)."""
    day = pd.Timedelta(days=1)
    if matrix.window >= day or matrix.window * matrix.n_windows <= day:
        return None
    starts = pd.DatetimeIndex([matrix.window_start(t) for t in range(matrix.n_windows)])
    hours = np.asarray(starts.hour, dtype=np.int64)
    weekdays = np.asarray(starts.day_of_week, dtype=np.int64)
    per_day = int(day // matrix.window)
    return CalendarTables(
        _binned(matrix.requests, hours, 24), _binned(matrix.requests, weekdays, 7), per_day
    )


def profile_features(
    matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
) -> list[np.ndarray]:
    """:data:`PROFILE_FEATURES` of ``items`` at history end ``t`` for window ``t + horizon``."""
    nan = np.full(len(items), np.nan, dtype=np.float32)
    calendar = calendar_tables(matrix)
    if calendar is None or len(items) == 0:
        return [nan] * len(PROFILE_FEATURES)
    hour_bin = _bin_at(matrix, t + horizon, "hour")
    day_bin = _bin_at(matrix, t + horizon, "day_of_week")
    age = np.maximum(t - matrix.first_seen[items], 0) + 1
    overall = running_tables(matrix).cum_requests[items, t] / age
    hour_mean, _ = calendar.hours.mean_by(items, t, hour_bin)
    now_mean, _ = calendar.hours.mean_by(items, t, int(calendar.hours.bins[t]))
    day_mean, _ = calendar.weekdays.mean_by(items, t, day_bin)
    # Only for items with more than a day of history: a profile needs each hour seen once.
    known = age > calendar.per_day
    scale = overall + 0.05
    values = [hour_mean, hour_mean / scale, now_mean / scale, day_mean / scale]
    return [np.where(known, v, np.nan).astype(np.float32) for v in values]


def _bin_at(matrix: CountMatrix, t: int, field: str) -> int:
    """Hour of day or day of week of window ``t`` (which may lie past the grid)."""
    return int(getattr(matrix.window_start(t), field))
