"""Features of an item's past on a dense item × window grid: lags, rolling means, recency,
its kind's share, for the counts shape of :mod:`pipeline.windows`.

``window_features`` runs each item from its first window with a request to the last window
of all (zero-filled, no further than its longest lag after its last request); ``whole_counts``
lets a batch of whole items get the features they would have among all the counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.errors import BadInputError
from pipeline.windows import KEYS

#: a dense item × window grid larger than this is refused: raise ``min_total_requests``
MAX_GRID_ROWS = 50_000_000


def infer_window(counts: pd.DataFrame) -> pd.Timedelta:
    """The window length of a counts frame: the smallest gap between distinct window starts."""
    starts = np.sort(pd.to_datetime(counts["window_start"], utc=True).unique())
    gaps = np.diff(starts)
    if len(gaps) == 0:
        raise BadInputError("one window only: pass window=", where="counts.window_start")
    return pd.Timedelta(gaps.min())


def _dense_grid(
    counts: pd.DataFrame,
    step: pd.Timedelta,
    min_total: int,
    horizon: int,
    last_window: pd.Timestamp | None = None,
) -> pd.DataFrame:
    """Every item from its first window to ``horizon`` windows after its last (or to the last
    window of all, ``last_window`` when given, if sooner), zero-filled."""
    totals = counts.groupby(KEYS, observed=True)["requests"].transform("sum")
    counts = counts[totals >= min_total]
    seen = counts.groupby(KEYS, observed=True, sort=True)["window_start"]
    first, last_seen = seen.min(), seen.max()
    if last_window is None:
        last_window = pd.to_datetime(counts["window_start"]).max()
    end = (last_seen + horizon * step).clip(upper=last_window)
    spans = ((end - first) // step).astype("int64").to_numpy() + 1
    if spans.sum() > MAX_GRID_ROWS:
        raise BadInputError(
            f"{spans.sum()} item-window rows; raise min_total_requests", where="window_features"
        )
    naive_first = first.dt.tz_convert(None).to_numpy()
    item = np.repeat(np.arange(len(first)), spans)
    offset = np.arange(spans.sum()) - np.repeat(np.cumsum(spans) - spans, spans)
    grid = pd.DataFrame(
        {
            "item_kind": first.index.get_level_values(0)[item],
            "item_key": first.index.get_level_values(1)[item],
            "window_start": naive_first[item] + offset * step.to_timedelta64(),
        }
    )
    grid["window_start"] = grid["window_start"].dt.tz_localize("UTC").astype("datetime64[us, UTC]")
    grid = grid.merge(counts, on=[*KEYS, "window_start"], how="left")
    value_cols = ["requests", "prompt_tokens", "output_tokens"]
    grid[value_cols] = grid[value_cols].fillna(0).astype("int64")
    return grid


def window_features(
    counts: pd.DataFrame,
    lags: Sequence[int] = (1, 2, 3, 6),
    rolling: Sequence[int] = (3, 6),
    window: str | pd.Timedelta | None = None,
    min_total_requests: int = 1,
    whole: WholeCounts | None = None,
) -> pd.DataFrame:
    """Lag and rolling features of ``requests`` on a dense item × window grid.

    Each item runs from its first window with a request to the last window of all, zero-filled,
    but no further than ``max(lags + rolling)`` windows after its last request (past that
    every lag and mean is zero: the rows would only cost memory).
    At window *t*: ``lag_k`` = requests at *t-k*; ``roll_mean_w`` = mean over *t-w+1 .. t*;
    ``seen_windows`` = windows up to *t* with a request; ``windows_since_seen`` = windows since
    the last one (0 when *t* has requests); ``share`` = the item's share of its kind's requests
    at *t*; ``hour``, ``weekday`` of the window; ``target_next`` = requests at *t+1* (missing on
    the last window). Items with fewer than ``min_total_requests`` requests in all are left out.

    ``whole``: the last window and the per-kind totals of a larger set of counts that
    ``counts`` is a batch of whole items of (each item's rows all in it): the features are
    then those of that set's rows for these items (:func:`whole_counts`).
    """
    if counts.empty:
        return counts.copy()
    step = pd.Timedelta(window) if window is not None else infer_window(counts)
    horizon = max([*lags, *rolling, 1])
    last_window = whole.last_window if whole is not None else None
    grid = _dense_grid(counts, step, min_total_requests, horizon, last_window)
    grid = grid.sort_values([*KEYS, "window_start"], ignore_index=True)
    group = grid.groupby(KEYS, observed=True, sort=False)["requests"]
    for k in lags:
        grid[f"lag_{k}"] = group.shift(k).fillna(0).astype("int64")
    cumulative = group.cumsum()
    cum_group = cumulative.groupby([grid["item_kind"], grid["item_key"]], sort=False)
    for w in rolling:
        earlier = cum_group.shift(w).fillna(0)
        span = np.minimum(group.cumcount().to_numpy() + 1, w)
        grid[f"roll_mean_{w}"] = (cumulative - earlier) / span
    _add_recency(grid, group)
    if whole is None:
        kind_total = grid.groupby(["item_kind", "window_start"], observed=True)["requests"]
        totals = kind_total.transform("sum")
    else:
        totals = grid[_KIND_WINDOW].merge(whole.kind_totals, on=_KIND_WINDOW, how="left")
        totals = totals["kind_requests"].fillna(0).set_axis(grid.index)
    grid["share"] = grid["requests"] / totals.replace(0, np.nan)
    grid["share"] = grid["share"].fillna(0.0)
    grid["hour"] = grid["window_start"].dt.hour.astype("int64")
    grid["weekday"] = grid["window_start"].dt.day_of_week.astype("int64")
    grid["target_next"] = group.shift(-1).astype("Int64")
    return grid


_KIND_WINDOW = ["item_kind", "window_start"]


@dataclass(frozen=True)
class WholeCounts:
    """What the features of a batch of items need from all the counts: the last window, and
    each kind's requests per window (``item_kind``, ``window_start``, ``kind_requests``)."""

    last_window: pd.Timestamp
    kind_totals: pd.DataFrame


def whole_counts(counts: pd.DataFrame) -> WholeCounts:
    """:class:`WholeCounts` of ``counts`` (those of items with enough requests)."""
    totals = counts.groupby(_KIND_WINDOW, observed=True, as_index=False)["requests"].sum()
    totals = totals.rename(columns={"requests": "kind_requests"})
    return WholeCounts(pd.to_datetime(counts["window_start"]).max(), totals)


def _add_recency(grid: pd.DataFrame, group: pd.core.groupby.SeriesGroupBy) -> None:
    seen = (grid["requests"] > 0).astype("int64")
    grid["seen_windows"] = seen.groupby([grid["item_kind"], grid["item_key"]]).cumsum()
    position = group.cumcount()
    last_seen = position.where(seen.astype(bool))
    last_seen = last_seen.groupby([grid["item_kind"], grid["item_key"]]).ffill()
    grid["windows_since_seen"] = (position - last_seen).astype("int64")
