"""Where finished frames go: kept in memory, or streamed into Parquet files.

Records and metrics arrive one chunk at a time; window counts are additive, so each chunk's
counts are computed on arrival and summed at the end. A Parquet sink never holds more than
one chunk's records.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.records import RECORD_COLUMNS, RECORD_DTYPES, conform_records
from pipeline.windows import COUNT_DTYPES, empty_counts, item_window_counts

_ARROW = {
    "datetime64[us, UTC]": pa.timestamp("us", tz="UTC"),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "Int64": pa.int64(),
    "Float64": pa.float64(),
    "object": pa.list_(pa.string()),
}
#: chunks' counts are summed every this many chunks (a window spans chunks; sums are exact)
COMBINE_EVERY = 4
RECORDS_SCHEMA = pa.schema([(c, _ARROW[t]) for c, t in RECORD_DTYPES.items()])


def records_table(frame: pd.DataFrame) -> pa.Table:
    """A conformed records frame as an Arrow table with the fixed records schema."""
    hashes = frame["prefix_hashes"]
    arrays = []
    for column in RECORD_COLUMNS:
        if column == "prefix_hashes":
            values = [list(map(str, h)) if _is_list(h) else None for h in hashes]
            arrays.append(pa.array(values, type=pa.list_(pa.string())))
        else:
            arrays.append(
                pa.Array.from_pandas(frame[column], type=RECORDS_SCHEMA.field(column).type)
            )
    return pa.Table.from_arrays(arrays, schema=RECORDS_SCHEMA)


def _is_list(value: object) -> bool:
    return isinstance(value, list | tuple | np.ndarray)


def read_records(path: str | Path) -> pd.DataFrame:
    """Read a ``records.parquet`` back as a conformed frame (``prefix_hashes`` as lists)."""
    frame = pq.read_table(path).to_pandas()
    frame["prefix_hashes"] = [list(h) if _is_list(h) else None for h in frame["prefix_hashes"]]
    return conform_records(frame)


def combine_counts(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Sum counts frames of several chunks into one counts frame."""
    parts = [p for p in parts if not p.empty]
    if not parts:
        return empty_counts()
    keys = ["item_kind", "item_key", "window_start"]
    merged = pd.concat(parts, ignore_index=True).groupby(keys, observed=True, sort=True).sum()
    return merged.reset_index().astype(COUNT_DTYPES)


class MemorySink:
    """Keeps every frame; used by :func:`pipeline.ingest.ingest_paths`."""

    def __init__(self, window: str) -> None:
        self.window = window
        self.records: list[pd.DataFrame] = []
        self.metrics: list[pd.DataFrame] = []
        self.counts: list[pd.DataFrame] = []

    def add_records(self, frame: pd.DataFrame) -> None:
        """One finished chunk of records (canonical columns)."""
        if not frame.empty:
            self.records.append(frame)
            self.add_counts(item_window_counts(frame, self.window))

    def add_metrics(self, frame: pd.DataFrame) -> None:
        """One finished chunk of engine metrics."""
        if not frame.empty:
            self.metrics.append(frame)

    def add_counts(self, frame: pd.DataFrame) -> None:
        """Counts of one chunk (or counts that come as such: ServeGen series)."""
        if not frame.empty:
            self.counts.append(frame)
        if len(self.counts) >= COMBINE_EVERY:  # keep one summed frame, not one per chunk
            self.counts = [combine_counts(self.counts)]


class ParquetSink(MemorySink):
    """Streams records into ``DIR/records.parquet``; keeps only counts and metrics."""

    def __init__(self, window: str, out_dir: Path) -> None:
        super().__init__(window)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "records.parquet"
        self.writer = pq.ParquetWriter(self.path, RECORDS_SCHEMA)
        self.rows = 0

    def add_records(self, frame: pd.DataFrame) -> None:
        """Write one chunk of records and keep its window counts."""
        if frame.empty:
            return
        self.writer.write_table(records_table(frame))
        self.rows += len(frame)
        self.add_counts(item_window_counts(frame, self.window))

    def close(self) -> None:
        """Finish the Parquet file (an empty run still leaves a valid, empty file)."""
        self.writer.close()
