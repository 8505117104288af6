"""Ingestion: vLLM and TGI logs and request traces become RequestRecords, metrics and windows.

``ingest_paths(paths, options)`` reads files (any mix of formats, ``.gz`` included), detects
each file's format (or takes ``options.format``), and returns an :class:`IngestResult`:

* ``records`` — canonical RequestRecords (:mod:`pipeline.records`);
* ``metrics`` — the engine-metrics time series from vLLM stats lines: ``ts``, ``source``,
  ``instance`` (file name, plus ``/Engine 000`` where logged), ``prompt_throughput`` and
  ``throughput`` (generation, tokens/s), ``running``, ``waiting``, ``swapped``, ``deferred``,
  ``preemptions``, ``kv_usage``, ``cpu_kv_usage``, ``prefix_cache_hit_rate``,
  ``cpu_prefix_cache_hit_rate``, ``external_prefix_cache_hit_rate``, ``mm_cache_hit_rate``
  (usages and rates as fractions 0..1; missing where the line has no such part);
* ``windows`` — every item × window count, with lag / rolling features on a dense grid
  (:mod:`pipeline.window_features`) for items with at least ``options.min_item_requests`` requests
  (rarer items keep their count rows, features missing), or ``None``;
* ``counts`` — every item × window count (the counts shape);
* ``summary`` — one :class:`FileSummary` per file: format, records, lines, rejected lines by
  reason with ``file:line`` samples, ignored lines by kind, assumptions made.

Trace formats and prewarm's own JSONL request format are described in
:mod:`pipeline.ingest.traces`; the vLLM year/zone defaults in :class:`IngestOptions`.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.ingest.chunk import METRIC_FIELDS
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.run import Progress, run_ingest
from pipeline.ingest.sinks import (
    COUNTS_SCHEMA,
    MemorySink,
    ParquetSink,
    counts_frame_of,
    with_pandas_dtypes,
)
from pipeline.ingest.state import IngestState
from pipeline.ingest.summary import FileSummary
from pipeline.records import records_frame
from pipeline.window_features import whole_counts, window_features
from pipeline.windows import COUNT_DTYPES

__all__ = [
    "FileSummary",
    "IngestOptions",
    "IngestResult",
    "IngestState",
    "ingest_paths",
    "ingest_to_dir",
]


@dataclass
class IngestResult:
    """Records, engine metrics, windows and the per-file summary of one ingest run."""

    records: pd.DataFrame
    metrics: pd.DataFrame
    windows: pd.DataFrame | None
    summary: list[FileSummary] = field(default_factory=list)
    #: every item × window count (the counts shape), rare items included
    counts: pd.DataFrame | None = None

    def summary_dict(self) -> dict[str, Any]:
        """JSON-ready summary: totals and one entry per file."""
        files = [s.to_dict() for s in self.summary]
        return {
            "files": files,
            "records": len(self.records),
            "metrics": len(self.metrics),
            "rejected": sum(sum(f["rejected"].values()) for f in files),
        }


def empty_metrics() -> pd.DataFrame:
    """A metrics frame with no rows."""
    frame = pd.DataFrame({c: pd.Series(dtype="Float64") for c in METRIC_FIELDS})
    frame["ts"] = frame["ts"].astype("datetime64[us, UTC]")
    frame[["source", "instance"]] = frame[["source", "instance"]].astype("string")
    return frame


def metrics_result(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """All metrics rows, in time order."""
    if not parts:
        return empty_metrics()
    return pd.concat(parts, ignore_index=True).sort_values("ts", kind="stable", ignore_index=True)


def windows_result(
    counts: pd.DataFrame, window: str, min_item_requests: int = 1
) -> pd.DataFrame | None:
    """Every count row, with lag/rolling features on a dense grid for the items seen at least
    ``min_item_requests`` times (rarer items keep their count rows, features missing);
    ``None`` when nothing was counted."""
    if counts.empty:
        return None
    totals = counts.groupby(["item_kind", "item_key"], observed=True)["requests"].transform("sum")
    frequent = counts[totals >= min_item_requests]
    rare = counts[totals < min_item_requests]
    if frequent.empty:
        return rare.reset_index(drop=True)
    features = _nullable_features(window_features(frequent, window=window))
    if rare.empty:
        return features
    return pd.concat([features, rare], ignore_index=True)


#: count rows whose features are computed at once: each batch's dense grid and its features
#: are a few hundred bytes a row, so a 1 GB vLLM log's 1.5M rows are written in a few batches
FEATURE_BATCH_ROWS = 150_000


def write_windows(counts: pa.Table, path: Path, options: IngestOptions) -> int:
    """``windows.parquet`` as :func:`windows_result` makes it, in bounded memory: the
    featured rows of frequent items (pandas, a batch of whole items at a time), then the
    count rows of rare ones (Arrow, never converted); returns the rows written. ``counts``
    is sorted by item and window (:meth:`MemorySink.summed_counts`), and so is each part."""
    starts = _item_starts(counts)
    requests = counts.column("requests").to_numpy()
    totals = np.add.reduceat(requests, starts) if len(starts) else requests[:0]
    lengths = np.diff(np.append(starts, counts.num_rows))
    keep = pa.array(np.repeat(totals >= options.min_item_requests, lengths))
    frequent, rare = counts.filter(keep), counts.filter(pc.invert(keep))
    if frequent.num_rows == 0:
        pq.write_table(with_pandas_dtypes(rare.cast(COUNTS_SCHEMA)), path)
        return rare.num_rows
    frequent = frequent.select(COUNTS_SCHEMA.names)
    whole = whole_counts(_kind_counts(frequent))
    rows, writer = 0, None
    try:
        for batch in _item_batches(frequent, FEATURE_BATCH_ROWS):
            frame = window_features(counts_frame_of(batch), window=options.window, whole=whole)
            features = _nullable_features(frame)
            table = pa.Table.from_pandas(features, preserve_index=False)
            del features
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table.cast(writer.schema))
            rows += table.num_rows
        assert writer is not None  # frequent has rows: one batch at least
        if rare.num_rows:
            writer.write_table(_without_features(rare, writer.schema))
    finally:
        if writer is not None:
            writer.close()
    return rows + rare.num_rows


def _nullable_features(features: pd.DataFrame) -> pd.DataFrame:
    """``features`` with its integer feature columns nullable: rare items' rows have none."""
    ints = [c for c in features.columns if c not in COUNTS_SCHEMA.names]
    ints = [c for c in ints if features[c].dtype == "int64"]
    features[ints] = features[ints].astype("Int64")
    return features


def _item_starts(counts: pa.Table) -> np.ndarray:
    """Where each item's rows begin in ``counts`` (sorted by item)."""
    if counts.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    kinds, keys = counts.column("item_kind"), counts.column("item_key")
    changed = pc.or_(
        pc.not_equal(kinds.slice(1), kinds.slice(0, len(kinds) - 1)),
        pc.not_equal(keys.slice(1), keys.slice(0, len(keys) - 1)),
    )
    later = np.flatnonzero(changed.to_numpy(zero_copy_only=False)) + 1
    return np.concatenate(([0], later)).astype(np.int64)


def _kind_counts(counts: pa.Table) -> pd.DataFrame:
    """The kind, window and requests of every count row (what :func:`whole_counts` reads)."""
    columns = ["item_kind", "window_start", "requests"]
    frame = counts.select(columns).to_pandas()
    return frame.astype({c: COUNT_DTYPES[c] for c in columns})


def _item_batches(counts: pa.Table, rows: int) -> Iterable[pa.Table]:
    """``counts`` (sorted by item) in slices of about ``rows`` rows that never split an item."""
    starts = _item_starts(counts)[1:]
    start = 0
    while start < counts.num_rows:
        at = int(np.searchsorted(starts, start + rows))  # the first item start at or past it
        stop = int(starts[at]) if at < len(starts) else counts.num_rows
        yield counts.slice(start, stop - start)
        start = stop


def _without_features(rare: pa.Table, schema: pa.Schema) -> pa.Table:
    """Rare items' count rows in the featured rows' schema (features missing). Features of
    one type share one array of nulls: a 1 GB vLLM log's 1.5M rare rows took 12 fresh 12 MB
    arrays, a quarter of the parent's time writing windows."""
    nulls: dict[pa.DataType, pa.Array] = {}
    for name in schema.names:
        if name not in rare.column_names:
            kind = schema.field(name).type
            if kind not in nulls:
                nulls[kind] = pa.nulls(rare.num_rows, kind)
            rare = rare.append_column(name, nulls[kind])
    return rare.select(schema.names).cast(schema)


def ingest_paths(
    paths: Iterable[str | Path],
    options: IngestOptions | None = None,
    state: IngestState | None = None,
    progress: Progress | None = None,
) -> IngestResult:
    """Ingest files and folders; with ``state``, read only what is new since the last run."""
    options = options or IngestOptions()
    sink = MemorySink(options.window)
    summaries = run_ingest(paths, options, sink, state, progress)
    records = pd.concat(sink.records, ignore_index=True) if sink.records else records_frame([])
    records = records.sort_values("ts", kind="stable", ignore_index=True)
    counts = counts_frame_of(sink.summed_counts())
    windows = windows_result(counts, options.window, options.min_item_requests)
    return IngestResult(records, metrics_result(sink.metrics), windows, summaries, counts)


def ingest_to_dir(
    paths: Iterable[str | Path],
    out_dir: str | Path,
    options: IngestOptions | None = None,
    state: IngestState | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Ingest into ``out_dir``: ``records.parquet`` (streamed, one chunk in memory at a time),
    ``windows.parquet`` (every count row, plus features for items with at least
    ``options.min_item_requests`` requests), ``counts.parquet`` (the counts shape alone) and
    ``metrics.parquet``; return the summary dict."""
    options = options or IngestOptions()
    out = Path(out_dir)
    sink = ParquetSink(options.window, out)
    try:
        summaries = run_ingest(paths, options, sink, state, progress)
        counts = sink.summed_counts()  # while the last records are written
    finally:
        sink.close()
    metrics = metrics_result(sink.metrics)
    metrics.to_parquet(out / "metrics.parquet", index=False)
    # counts.parquet is encoded beside windows.parquet (Arrow lets the GIL go): the two are
    # ~0.14 and ~0.24 CPU-s of a 1 GB vLLM log's 1.5M count rows, on otherwise idle cores
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="counts-writer") as writer:
        written = writer.submit(pq.write_table, with_pandas_dtypes(counts), out / "counts.parquet")
        windows_rows = write_windows(counts, out / "windows.parquet", options)
        written.result()
    files = [s.to_dict() for s in summaries]
    return {
        "files": files,
        "records": sink.rows,
        "metrics": len(metrics),
        "windows": windows_rows,
        "rejected": sum(sum(f["rejected"].values()) for f in files),
        "out": str(out),
    }
