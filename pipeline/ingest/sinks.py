"""Where finished frames go: kept in memory, or streamed into Parquet files.

Records and metrics arrive one chunk at a time; window counts are additive, so each chunk's
counts are computed on arrival, kept with those of the same windows (a few buckets of
windows, see :data:`WINDOW_BUCKETS`) and summed once a bucket has gathered enough rows
(:data:`SUM_AT_ROWS`), and once more at the end. A Parquet sink holds at most two chunks'
records: the one being written and the next.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.ingest.count_sums import COUNT_KEYS, COUNT_VALUES, sum_counts
from pipeline.records import (
    HASHES_TYPE,
    RECORD_COLUMNS,
    RECORD_DTYPES,
    arrow_hashes,
    conform_records,
)
from pipeline.windows import COUNT_DTYPES, COUNTS_SCHEMA, empty_counts, window_counts_table

_ARROW = {
    "datetime64[us, UTC]": pa.timestamp("us", tz="UTC"),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "Int64": pa.int64(),
    "UInt64": pa.uint64(),
    "Float64": pa.float64(),
    "object": pa.list_(pa.string()),
}
#: Arrow types read back as pandas' nullable dtypes (the records' own, see RECORD_DTYPES)
_NULLABLE = {
    pa.string(): pd.StringDtype(),
    pa.bool_(): pd.BooleanDtype(),
    pa.int64(): pd.Int64Dtype(),
    pa.uint64(): pd.UInt64Dtype(),
    pa.float64(): pd.Float64Dtype(),
}
#: counts are kept in this many buckets of windows (window number modulo it): a log's chunks
#: come in time order, so a chunk's counts are summed with its own windows' bucket only, not
#: with everything counted so far (whose re-sum grew to ~450 MB at the end of a 1 GB vLLM
#: log); buckets hold disjoint windows, so a bucket's sum is final for its own
WINDOW_BUCKETS = 16
#: a bucket's counts are summed once the rows added since its last sum reach this many (~6 MB
#: of vLLM counts; at most ~100 MB not summed in all 16 buckets) and the rows its last sum
#: left: so each row is summed about twice however long the log, and rarely where summing
#: gains nothing (a 1 GB vLLM log's 1.5M count rows hold 0.3% repeats: its buckets of 80k to
#: 125k rows are summed once at most before the end, where one sort sums everything)
SUM_AT_ROWS = 100_000
RECORDS_SCHEMA = pa.schema([(c, _ARROW[t]) for c, t in RECORD_DTYPES.items()])
#: the records' Parquet columns (a list's values are a column of their own)
_LEAVES = [f"{c}.list.element" if c == "prefix_hashes" else c for c in RECORD_COLUMNS]
#: records columns whose values are (nearly) all distinct: a dictionary is built for them only
#: to be given up after a page, so they are written plain from the start (the same values read
#: back). Of a 1 GB vLLM log's records, ~0.13 CPU-s in 12 row groups instead of ~0.17; the
#: file ~2% larger.
_PLAIN = ("request_id", "prompt", "prefix_hashes.list.element")
#: no min/max statistics for prompts and block hashes: values no reader filters row groups on
_NO_STATISTICS = ("prompt", "prefix_hashes.list.element")


def records_table(frame: pd.DataFrame) -> pa.Table:
    """A conformed records frame as an Arrow table with the fixed records schema."""
    arrays = []
    for column in RECORD_COLUMNS:
        if column == "prefix_hashes":
            arrays.append(_hashes_array(frame["prefix_hashes"]))
        else:
            arrays.append(
                pa.Array.from_pandas(frame[column], type=RECORDS_SCHEMA.field(column).type)
            )
    return pa.Table.from_arrays(arrays, schema=RECORDS_SCHEMA)


def _hashes_array(hashes: pd.Series) -> pa.Array:
    """``prefix_hashes`` as Arrow lists of strings (already so: as they are)."""
    held = arrow_hashes(hashes)
    if held is not None:
        return held.cast(HASHES_TYPE)
    if hashes.isna().all():  # no prompts: no per-row pass
        return pa.nulls(len(hashes), HASHES_TYPE)
    values = [list(map(str, h)) if _is_list(h) else None for h in hashes]
    return pa.array(values, type=HASHES_TYPE)


def _is_list(value: object) -> bool:
    return isinstance(value, list | tuple | np.ndarray)


def read_records(path: str | Path) -> pd.DataFrame:
    """Read a ``records.parquet`` back as a conformed frame (``prefix_hashes`` as lists)."""
    return records_of(pq.read_table(path))


def records_of(table: pa.Table) -> pd.DataFrame:
    """A records table (:data:`RECORDS_SCHEMA`) as a conformed frame (hashes as lists);
    columns with missing values become pandas' nullable types straight from Arrow (a u64
    seed never passes through float64)."""
    frame = table.to_pandas(types_mapper=_NULLABLE.get)
    frame["prefix_hashes"] = [list(h) if _is_list(h) else None for h in frame["prefix_hashes"]]
    return conform_records(frame)


def with_pandas_dtypes(table: pa.Table) -> pa.Table:
    """``table`` with the pandas metadata of the counts shape, so ``pd.read_parquet`` gives
    ``string`` (not ``object``) columns back."""
    metadata = pa.Table.from_pandas(empty_counts(), preserve_index=False).schema.metadata
    return table.replace_schema_metadata(metadata)


def counts_table(frame: pd.DataFrame) -> pa.Table:
    """A counts frame as Arrow (strings cost ~10 bytes a row there, ~70 as Python objects)."""
    columns = [*COUNT_KEYS, *COUNT_VALUES]
    return pa.Table.from_pandas(frame[columns], schema=COUNTS_SCHEMA, preserve_index=False)


def counts_frame_of(table: pa.Table) -> pd.DataFrame:
    """A counts table back as a counts-shape DataFrame."""
    if table.num_rows == 0:
        return empty_counts()
    return table.to_pandas().astype(COUNT_DTYPES)


def combine_counts(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Sum counts frames of several chunks into one counts frame."""
    return counts_frame_of(sum_counts([counts_table(p) for p in parts if not p.empty]))


class MemorySink:
    """Keeps every frame; used by :func:`pipeline.ingest.ingest_paths`."""

    def __init__(self, window: str) -> None:
        self.window = window
        self.records: list[pd.DataFrame] = []
        self.metrics: list[pd.DataFrame] = []
        #: counts per bucket of windows (see WINDOW_BUCKETS)
        self.counts: dict[int, _Bucket] = {}
        self._step_us = max(1, pd.Timedelta(window).value // 1000)

    def add_records(self, frame: pd.DataFrame, counts: pa.Table | None = None) -> None:
        """One finished chunk of records (canonical columns), with its window counts
        (:func:`~pipeline.windows.window_counts_table`) when already computed."""
        if not frame.empty:
            self.records.append(frame)
            self._add_counts_of(frame, counts)

    def _add_counts_of(self, frame: pd.DataFrame, counts: pa.Table | None) -> None:
        if counts is None:
            counts = window_counts_table(frame, self.window, ordered=False)
        self.add_counts_table(counts)

    def add_metrics(self, frame: pd.DataFrame) -> None:
        """One finished chunk of engine metrics."""
        if not frame.empty:
            self.metrics.append(frame)

    def add_counts(self, frame: pd.DataFrame) -> None:
        """Counts of one chunk (or counts that come as such: ServeGen series)."""
        if not frame.empty:
            self.add_counts_table(counts_table(frame))

    def add_counts_table(self, table: pa.Table) -> None:
        """Counts of one chunk as an Arrow table (:data:`COUNTS_SCHEMA`)."""
        for bucket, rows in self._by_bucket(table):
            self.counts.setdefault(bucket, _Bucket()).add(rows)

    def _by_bucket(self, table: pa.Table) -> Iterator[tuple[int, pa.Table]]:
        """``table``'s rows by bucket of windows: one sort by bucket, then a slice for each
        (a chunk's windows are one or two of its log's: often all in one bucket)."""
        if table.num_rows == 0:
            return
        starts = table.column("window_start").cast(pa.int64()).to_numpy()
        buckets = starts // self._step_us % WINDOW_BUCKETS
        if (buckets == buckets[0]).all():
            yield int(buckets[0]), table
            return
        order = np.argsort(buckets, kind="stable")
        table, buckets = table.take(order), buckets[order]
        edges = [0, *(np.flatnonzero(np.diff(buckets)) + 1).tolist(), len(buckets)]
        for begin, end in pairwise(edges):
            yield int(buckets[begin]), table.slice(begin, end - begin)

    def summed_counts(self) -> pa.Table:
        """Every count added, summed and sorted (the buckets are let go)."""
        tables = [t for b in sorted(self.counts) for t in self.counts.pop(b).tables]
        return sum_counts(tables)


@dataclass
class _Bucket:
    """The counts tables of one bucket of windows, and how many of their rows a sum left
    (``summed_rows``, the first table's) or were added since (``added_rows``)."""

    tables: list[pa.Table] = field(default_factory=list)
    summed_rows: int = 0
    added_rows: int = 0

    def add(self, table: pa.Table) -> None:
        """Keep ``table``; sum the bucket once enough rows came (see :data:`SUM_AT_ROWS`)."""
        self.tables.append(table)
        self.added_rows += table.num_rows
        if self.added_rows >= max(self.summed_rows, SUM_AT_ROWS):
            self.tables = [sum_counts(self.tables)]
            self.summed_rows, self.added_rows = self.tables[0].num_rows, 0


class ParquetSink(MemorySink):
    """Streams records into ``DIR/records.parquet``; keeps only counts and metrics.

    A chunk's table is encoded and written in a thread (Arrow releases the GIL) while the
    next chunk is finished: never more than one write in flight, in chunk order."""

    def __init__(self, window: str, out_dir: Path) -> None:
        super().__init__(window)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "records.parquet"
        self.writer = pq.ParquetWriter(
            self.path, RECORDS_SCHEMA,
            use_dictionary=[c for c in _LEAVES if c not in _PLAIN],
            write_statistics=[c for c in _LEAVES if c not in _NO_STATISTICS],
        )  # fmt: skip
        self.rows = 0
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="records-writer")
        self._writing: Future[None] | None = None

    def add_records(self, frame: pd.DataFrame, counts: pa.Table | None = None) -> None:
        """Write one chunk of records and keep its window counts (given, or computed)."""
        if frame.empty:
            return
        self._write(records_table(frame))
        self._add_counts_of(frame, counts)

    def add_records_table(self, table: pa.Table, counts: pa.Table) -> None:
        """Write one chunk of records already converted by :func:`records_table`, with its
        window counts."""
        if table.num_rows == 0:
            return
        self._write(table)
        self.add_counts_table(counts)

    def _write(self, table: pa.Table) -> None:
        self._wait()
        self.rows += table.num_rows
        self._writing = self._thread.submit(self.writer.write_table, table)

    def _wait(self) -> None:
        """Let the write in flight end (its error, a full disk, is raised here)."""
        if self._writing is not None:
            writing, self._writing = self._writing, None
            writing.result()

    def close(self) -> None:
        """Finish the Parquet file (an empty run still leaves a valid, empty file)."""
        try:
            self._wait()
        finally:
            self._thread.shutdown()
            self.writer.close()
