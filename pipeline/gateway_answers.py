"""What a gateway's cache answered (pure): its request log's records counted per window."""

from __future__ import annotations

import pandas as pd

_EPOCH = pd.Timestamp(0, tz="UTC")


def cache_answers(records: pd.DataFrame, window_s: int) -> list[tuple[float, int, int]]:
    """(window start, requests, answered from the gateway's cache) per window of a gateway's
    records (those that say whether its cache answered), in time order."""
    if "cache_hit" not in records.columns or records.empty:
        return []
    known = records[records["cache_hit"].notna()]
    if known.empty:
        return []
    # whole seconds since the epoch, whatever the column's unit (records hold microseconds)
    seconds = (pd.to_datetime(known["ts"], utc=True) - _EPOCH) // pd.Timedelta(seconds=1)
    starts = seconds // window_s * window_s
    hits = known["cache_hit"].astype(bool).astype(int)
    grouped = hits.groupby(starts.to_numpy()).agg(["count", "sum"])
    return [(float(start), int(row["count"]), int(row["sum"])) for start, row in grouped.iterrows()]
