"""Finishing a log file's chunks into records, spread over worker processes.

Once every chunk of a file is parsed, each chunk's heads still need the tails of later chunks,
resolved timestamps, the canonical columns and their window counts. Those steps read only the
chunk's own part and a few file-wide facts (year base, ``--max-log-len``), so they run in
parallel; the parent only writes what comes back, in chunk order. A few pieces per process
are in flight (``JOBS_AHEAD`` in :mod:`pipeline.ingest.run`), so memory stays bounded by the
chunk size.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import pandas as pd
import pyarrow as pa

from pipeline.ingest import assemble, formats
from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.formats import FileFacts, LogFormat, Piece
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.parse import heads_of, metrics_of
from pipeline.ingest.sinks import records_table
from pipeline.records import listed_hashes
from pipeline.windows import records_window_counts, window_counts_table

#: request ids of a file remembered for the next incremental run (reused-id detection)
RECENT_IDS = 2000

Job = TypeVar("Job")
Done = TypeVar("Done")


@dataclass(frozen=True)
class PartJob:
    """One piece's heads part and the file-wide facts needed to finish it."""

    part: str
    tails: dict[str, dict[str, Any]]
    chunk: ChunkResult
    index: int
    format: str
    facts: FileFacts
    options: IngestOptions
    window: str
    #: hand the records back as an Arrow table (for a Parquet sink): converted here, in
    #: parallel, and cheaper to send than a frame of Python lists
    as_table: bool = False
    #: the piece's metrics part, finished here too (None: the format has none)
    metrics_part: str | None = None
    #: leave the records table and its counts in ``<store>.records.arrow`` and
    #: ``<store>.counts.arrow`` instead of handing them back ("": hand them back); see
    #: :func:`store_tables`
    store: str = ""
    #: the parts are this run's scratch, removed once read (not a distributed ingest's parts,
    #: kept for a task run again)
    scratch: bool = False


@dataclass
class FinishedPart:
    """A chunk's canonical records (a frame, or an Arrow table) and their window counts
    (:func:`~pipeline.windows.window_counts_table`; ``None``: no heads)."""

    used: set[str]
    records: pd.DataFrame | None = None
    counts: pa.Table | None = None
    recent_ids: list[str] = field(default_factory=list)
    table: pa.Table | None = None
    rows: int = 0
    #: the piece's engine metrics, times resolved (``None``: not asked for)
    metrics: pd.DataFrame | None = None
    #: where :func:`store_tables` left ``table`` and ``counts`` ("": not stored)
    stored: str = ""


def write_table_part(table: pa.Table, path: str) -> None:
    """An Arrow table as an uncompressed Arrow IPC scratch file."""
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def read_table_part(path: str) -> pa.Table:
    """A scratch file back as an Arrow table."""
    with pa.OSFile(path, "rb") as source:  # read whole, not mapped: its pages stay private
        return pa.ipc.open_file(source).read_all()


def map_table_part(path: str) -> pa.Table:
    """A scratch file back as an Arrow table that reads its memory-mapped pages (no copy; they
    stay mapped while the table lives, even if the file is removed)."""
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).read_all()


def read_part(path: str) -> pd.DataFrame:
    """Read a scratch part back (``prefix_hashes`` as lists again)."""
    table = read_table_part(path)
    if "prefix_hashes" not in table.column_names:
        return table.to_pandas()
    # Arrow's lists straight to Python lists: ~4x faster than through pandas' arrays of objects
    hashes = table.column("prefix_hashes").to_pylist()
    frame = table.drop_columns(["prefix_hashes"]).to_pandas()
    frame.insert(table.column_names.index("prefix_hashes"), "prefix_hashes", hashes)
    return frame


def read_heads(path: str, mapped: bool = False) -> pd.DataFrame:
    """A log piece's heads part (:func:`~pipeline.ingest.parse.heads_table`) as a heads
    frame, its block hashes still in Arrow; ``mapped``: its pages read in place
    (:func:`map_table_part`), for a part nothing will write again while it is mapped."""
    return heads_of(map_table_part(path) if mapped else read_table_part(path))


def read_metrics(path: str) -> pd.DataFrame:
    """A log piece's metrics part (:func:`~pipeline.ingest.parse.metrics_table`) as a frame."""
    return metrics_of(read_table_part(path))


def finish_part(job: PartJob) -> FinishedPart:
    """Join later tails, resolve timestamps, conform the columns and count windows."""
    pa.default_memory_pool().release_unused()  # the previous chunk's buffers, kept for reuse
    # A run's own scratch part is mapped, not copied (~0.07 CPU-s a GB vLLM log): it is written
    # once before its job exists and only removed; a distributed ingest's part may be written
    # again by a redelivered task, and a file cut short under a mapping faults its reader.
    # The heads are handed on with no other reference, so they go early.
    done = finish_frame(job, read_heads(job.part, job.scratch))
    if job.metrics_part is not None:
        log_format = cast(LogFormat, formats.get(job.format))
        done.metrics = finished_metrics(
            job.metrics_part, log_format, job.chunk, job.facts, job.index, job.options
        )
    if job.scratch:
        _remove_parts(job)
    if job.store and done.table is not None and done.counts is not None:
        store_tables(done, job.store)
    return done


def _remove_parts(job: PartJob) -> None:
    """Remove a piece's parts once read: their pages go here, beside the other finishing
    processes, not all in the run's last, lone step (~0.03 s for a 1 GB vLLM log's 700 MB)."""
    os.unlink(job.part)
    if job.metrics_part is not None:
        os.unlink(job.metrics_part)


def store_tables(done: FinishedPart, store: str) -> None:
    """Move ``done``'s records table and counts into scratch files, for the parent to map.

    Handed back through the pool's pipe (pickled, copied, unpickled), a 1 GB vLLM log's 65
    pieces of ~9 MB records and ~4 MB counts cost ~0.3 CPU-s more in the finishing processes
    and ~0.2 more in the parent than written once into the page cache and mapped."""
    table, counts = cast(pa.Table, done.table), cast(pa.Table, done.counts)
    write_table_part(table, f"{store}.records.arrow")
    write_table_part(counts, f"{store}.counts.arrow")
    done.table = done.counts = None
    done.stored = store


def stored_tables(done: FinishedPart) -> tuple[pa.Table, pa.Table]:
    """The records table and counts :func:`store_tables` left (mapped, the files removed)."""
    tables = []
    for kind in ("records", "counts"):
        path = f"{done.stored}.{kind}.arrow"
        tables.append(map_table_part(path))
        os.unlink(path)
    return tables[0], tables[1]


def finished_metrics(
    path: str,
    log_format: LogFormat,
    chunk: ChunkResult,
    facts: FileFacts,
    index: int,
    options: IngestOptions,
) -> pd.DataFrame:
    """A piece's metrics part with its times resolved, ready for a sink."""
    frame = read_metrics(path)
    if not frame.empty:
        frame["ts"] = log_format.resolve_ts(frame, Piece(chunk, facts, index, options))
    del frame["_line"]  # in place: drop() copied every column, a sixth of this step
    return frame


def finish_frame(job: PartJob, frame: pd.DataFrame) -> FinishedPart:
    """:func:`finish_part` of heads already in memory (``job.part`` is not read)."""
    done = FinishedPart(assemble.apply_tails(frame, job.tails))
    if frame.empty:
        return done
    log_format = cast(LogFormat, formats.get(job.format))
    piece = Piece(job.chunk, job.facts, job.index, job.options)
    frame["ts"] = log_format.resolve_ts(frame, piece)
    done.recent_ids = frame["request_id"].dropna().iloc[-RECENT_IDS:].tolist()
    records = log_format.finalize(frame, job.facts, job.options)
    del frame  # the heads and the records of a chunk are never both needed past this point
    done.rows = len(records)
    # the counts are left unordered: they are summed (and sorted) later
    if job.as_table:
        done.table = records_table(records)
        del records
        if done.rows:  # counted from the Arrow table, not the frame: nothing converted again
            done.counts = records_window_counts(done.table, job.window)
    else:
        if done.rows:
            done.counts = window_counts_table(records, job.window, ordered=False)
        done.records = listed_hashes(records)
    return done


@contextlib.contextmanager
def finishing_pool(workers: int) -> Iterator[Executor | None]:
    """``workers`` processes that finish a file's pieces (``None``: this one), shut down after.
    They fork at the first job, when the file's pieces are parsed: the parent is still small
    then (its counts grow as the pieces come back), and its pages are shared."""
    if workers < 1:
        yield None
        return
    # fork: the workers inherit the imported modules (a fresh interpreter costs ~1 s each)
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        yield pool


def ordered_map(
    fn: Callable[[Job], Done], jobs: Iterable[Job], pool: Executor | None, ahead: int
) -> Iterator[Done]:
    """``map(fn, jobs)`` on ``pool`` (or here), in order, at most ``ahead`` jobs in flight."""
    if pool is None:
        yield from map(fn, jobs)
        return
    pending: deque[Future[Done]] = deque()
    for job in jobs:
        pending.append(pool.submit(fn, job))
        if len(pending) >= ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()
