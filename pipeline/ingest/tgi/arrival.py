"""A TGI record's time: the event's time (RFC 3339, UTC) minus the request's total time, i.e.
its arrival."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.ingest.columnar import TIME_LOW, router_times

#: a total time past this is junk (a Rust ``Duration`` prints up to ~1.8e19 s): the request's
#: arrival is unknown, not a time centuries back (which no timestamp can hold)
_LONGEST_TOTAL_S = 100 * 365.25 * 86400


def arrival_ts(frame: pd.DataFrame) -> pd.Series:
    """Event time (UTC, µs) minus the request's total time: the arrival time (``NaT`` for a
    total time past :data:`_LONGEST_TOTAL_S`)."""
    ts = _event_times(frame["ts"])
    seconds = frame["_ts_minus_s"].fillna(0.0).astype(float)
    known = seconds.abs() <= _LONGEST_TOTAL_S
    back = pd.to_timedelta(seconds.where(known, 0.0), unit="s")
    return (ts - back).where(known).astype("datetime64[us, UTC]")


def _event_times(ts: pd.Series) -> pd.Series:
    """Event times (RFC 3339 texts) as UTC instants (``NaT`` where unreadable).

    Times of the router's shape are read by Arrow, after numpy checked the shape on the bytes
    (0.01 s instead of 0.046 s for 150,000 times); pandas' ISO 8601 reader, which the others
    go to, gives those the same instants. Arrow refuses a time that is no date or time of day
    (pandas makes it ``NaT``): then all go to pandas."""
    if isinstance(ts.dtype, pd.StringDtype) and len(ts) and not ts.hasnans:
        texts = pa.array(ts.array, pa.string())
        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        if _all_router_times(texts):
            try:
                instants = texts.cast(pa.timestamp("us", "UTC"))
            except pa.ArrowInvalid:
                pass
            else:
                return pd.Series(instants.to_pandas().array, index=ts.index)
    return pd.to_datetime(ts.astype(str), utc=True, format="ISO8601", errors="coerce")


def _all_router_times(texts: pa.StringArray) -> bool:
    """Whether every text has the router's shape (27 characters, :func:`router_times`)."""
    width = len(TIME_LOW)
    offsets = np.frombuffer(texts.buffers()[1], np.int32, len(texts) + 1, texts.offset * 4)
    if np.any(np.diff(offsets) != width):
        return False
    chars = np.frombuffer(texts.buffers()[2], np.uint8)[offsets[0] : offsets[-1]]
    return bool(router_times(chars.reshape(-1, width)).all())
