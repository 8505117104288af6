"""Closing a window: what its requests used against what was warmed and predicted for it.

One function for every caller — the loop's window tick and the demo — so coverage, misses by
cause and the forecast's error on ``/metrics`` come from the same code in production and in the
demo.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from pipeline.window_outcome import WindowOutcome, request_items
from tasks.adapters import telemetry
from tasks.adapters.store import Store


def seconds(ts: pd.Series) -> pd.Series:
    """Unix seconds of a ``ts`` column."""
    return (pd.to_datetime(ts, utc=True) - pd.Timestamp(0, tz="UTC")) / pd.Timedelta(seconds=1)


def close_window(
    store: Store,
    engine: str,
    window: tuple[float, float],
    records: pd.DataFrame,
    predicted: Mapping[str, float] | None = None,
) -> WindowOutcome | None:
    """Record the window ``[start, end)`` of ``engine``: its requests per item (the deepest
    planned block of each request's chain) against what was warmed, and the forecast's error
    against ``predicted`` (item key → hits the plan for that window expected). None: the
    records hold no block chains or no request of the window."""
    if records.empty or "prefix_hashes" not in records:
        return None
    ts = seconds(records["ts"])
    inside = records[(ts >= window[0]) & (ts < window[1])]
    if inside.empty:
        return None
    known = telemetry.warm_state(store, engine).planned
    observed = request_items(inside["prefix_hashes"], known)
    seen = {h for chain in records[ts < window[0]]["prefix_hashes"].dropna() for h in chain}
    return telemetry.record_window(store, engine, window, observed, seen, predicted)
