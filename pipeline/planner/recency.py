"""After a drift, the newest windows count more (pure): the history before the change is
another workload, so a plan's forecast takes it at a fraction of its weight.

A drift trigger (``topic_drift``, :mod:`pipeline.topic_drift`) names the window where the mix
moved; until the loop's ``topics.weight_windows`` have passed, plans take every window before it
at :data:`OLDER_WINDOW_WEIGHT`: the frequency estimate on the records' per-window counts
(:func:`weigh_windows`) and the learned forecaster on the item × window counts it predicts from
(:func:`weigh_counts`).
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

#: Weight of a window before the drift. The frequency estimate's history rate holds an old
#: item at its mean for as many windows as the history is long (12 windows of one topic kept
#: a prefix of the old topic above one of the new for 2-3 windows after a full change); at a
#: tenth, a new item used as often in one window ranks above it at once.
OLDER_WINDOW_WEIGHT = 0.1


def weigh_windows(
    windows: Mapping[int, float], first: int | None, older: float = OLDER_WINDOW_WEIGHT
) -> dict[int, float]:
    """Per-window counts with windows before ``first`` (a window number) scaled by ``older``;
    unchanged when ``first`` is None."""
    if first is None:
        return dict(windows)
    return {w: n * (older if w < first else 1.0) for w, n in windows.items()}


def weigh_counts(
    counts: pd.DataFrame, since: float | None, older: float = OLDER_WINDOW_WEIGHT
) -> pd.DataFrame:
    """Item × window counts with the ``requests`` of windows starting before ``since`` (Unix
    seconds) scaled by ``older``; the same frame when ``since`` is None."""
    if since is None or counts.empty:
        return counts
    starts = pd.to_datetime(counts["window_start"], utc=True)
    before = starts < pd.Timestamp(since, unit="s", tz="UTC")
    weighted = counts.copy()
    weighted["requests"] = (
        counts["requests"].astype(float).where(~before, counts["requests"].astype(float) * older)
    )
    return weighted
