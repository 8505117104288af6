"""Cutting a file into chunks at line boundaries, and parsing one chunk.

A chunk is a byte range ``[start, end)`` of a plain log file that begins where its format
says a record may start (TGI text: an event, so a multi-line message is never split).
``.gz`` files and traces are one chunk each; a chunk is parsed in pieces of bounded size.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest import formats, line_prefixes
from pipeline.ingest.chunk import HEAD_FIELDS, METRIC_FIELDS, ChunkResult
from pipeline.ingest.columnar import arrow_to_pandas, typed_values
from pipeline.ingest.formats import LogFormat, TraceFormat
from pipeline.ingest.lines import BLOCK_BYTES, LineReader, is_compressed
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.summary import Rejects
from pipeline.records import HASHES_TYPE, RECORD_DTYPES

#: how far past a planned cut to look for the start of a line / an event
_BOUNDARY_SCAN = 8 << 20
#: how far past it to look first
_FIRST_SCAN = 64 << 10
#: how far before a planned cut a runtime's pieces of long lines are followed (64 pieces of
#: 16 KiB: a line of a 1 MiB prompt)
_PIECES_BACK = 1 << 20


@dataclass(frozen=True)
class ChunkSpec:
    """One byte range of one file, in a known format; ``index`` orders chunks of a file;
    ``first_line`` is the number of the line at ``start`` (a trace's request ids are
    ``<file>:<line>``, the same whether the file is read whole or as it grows)."""

    path: str
    format: str
    start: int
    end: int | None
    index: int = 0
    first_line: int = 1
    #: the container runtime's prefix every line carries (:mod:`~pipeline.ingest.line_prefixes`)
    line_prefix: str | None = None


def _next_boundary(
    path: Path, log_format: LogFormat, offset: int, line_prefix: str | None = None
) -> int | None:
    """The first line (event) start at or after ``offset``; ``None`` if none close by. Under a
    runtime that cuts long lines into pieces, never inside such a line: each stream's pieces
    are followed from :data:`_PIECES_BACK` before ``offset`` (another stream's lines may lie
    between a line's pieces).

    The usual file has a start within a few KB: :data:`_FIRST_SCAN` is read first, and the
    whole :data:`_BOUNDARY_SCAN` only when no line that ends inside it starts a record (a
    1 GB log's 32 cuts read 2 MB instead of 256 MB: ~0.05 CPU-s and ~0.1 s of the start)."""
    if line_prefixes.piece_reader(line_prefix) is None:
        found = _boundary_in(path, log_format, offset, line_prefix, _FIRST_SCAN, whole_lines=True)
        if found is not None:
            return found
    return _boundary_in(path, log_format, offset, line_prefix, _BOUNDARY_SCAN)


def _boundary_in(
    path: Path,
    log_format: LogFormat,
    offset: int,
    line_prefix: str | None,
    scan: int,
    whole_lines: bool = False,
) -> int | None:
    """:func:`_next_boundary` within ``scan`` bytes after ``offset``; ``whole_lines``: a line
    the scan cuts off is not judged (None instead)."""
    read_piece = line_prefixes.piece_reader(line_prefix)
    begin = max(0, offset - 1 - (0 if read_piece is None else _PIECES_BACK))
    with open(path, "rb") as handle:
        handle.seek(begin)
        data = handle.read(scan + max(0, offset - 1) - begin)
    if read_piece is not None and begin == 0:  # the file's first line is followed too
        data, begin = b"\n" + data, -1
    cut: set[str] = set()  # the streams inside a line cut into pieces
    pos = data.find(b"\n")
    while 0 <= pos < len(data) - 1:
        end = data.find(b"\n", pos + 1)
        if end < 0 and whole_lines:
            return None
        whole = data[pos + 1 : end if end >= 0 else len(data)].decode("utf-8", "replace")
        if begin + pos + 1 >= offset and not cut:
            line = whole if line_prefix is None else line_prefixes.stripped([whole], line_prefix)[0]
            if log_format.starts_record(line):
                return begin + pos + 1
        if read_piece is not None and (piece := read_piece(whole)) is not None:
            (cut.add if piece[2] else cut.discard)(piece[1])
        if end < 0:
            return None
        pos = end
    return None


def plan_chunks(
    path: str | Path,
    fmt: str,
    chunk_bytes: int,
    start: int = 0,
    first_line: int = 1,
    line_prefix: str | None = None,
) -> list[ChunkSpec]:
    """Chunks of ``path`` from byte ``start`` (line ``first_line``) on, about ``chunk_bytes``
    each; ``line_prefix``: the runtime's prefix of its lines."""
    path = Path(path)
    size = path.stat().st_size
    log_format = formats.get(fmt)
    if not isinstance(log_format, LogFormat) or is_compressed(path) or size - start <= chunk_bytes:
        return [ChunkSpec(str(path), fmt, start, None, 0, first_line, line_prefix)]
    cuts = [start]
    target = start + chunk_bytes
    while target < size:
        cut = _next_boundary(path, log_format, target, line_prefix)
        if cut is None or cut >= size:
            break
        if cut > cuts[-1]:
            cuts.append(cut)
        target = max(cut, target) + chunk_bytes
    ends: list[int | None] = [*cuts[1:], None]
    return [
        ChunkSpec(str(path), fmt, a, b, i, line_prefix=line_prefix)
        for i, (a, b) in enumerate(zip(cuts, ends, strict=True))
    ]


def parse_chunk(spec: ChunkSpec, options: IngestOptions, partial_tail: bool = True) -> ChunkResult:
    """Parse one chunk into one result (its pieces merged; for small chunks and tests)."""
    pieces = list(parse_pieces(spec, options, partial_tail))
    return pieces[0] if len(pieces) == 1 else merge_pieces(pieces)


def parse_pieces(
    spec: ChunkSpec, options: IngestOptions, partial_tail: bool = True
) -> Iterator[ChunkResult]:
    """Parse one chunk as pieces of about ``options.chunk_bytes`` each; bad lines are counted,
    never raised.

    A plain file's chunk is about one piece; a ``.gz`` file is one chunk (it cannot be entered
    in the middle) of any decompressed size, so it is cut here, at a line (TGI text: event)
    start, and no piece holds more than a chunk's records: memory stays bounded whatever the
    compression ratio.
    """
    log_format = formats.get(spec.format)
    if not isinstance(log_format, LogFormat):
        yield _parse_trace(spec, options, cast(TraceFormat, log_format), partial_tail)
        return
    reader = LineReader(
        spec.path, Rejects(spec.path), start=spec.start, end=spec.end,
        max_line_bytes=options.max_line_bytes, partial_tail=partial_tail,
        block_bytes=min(BLOCK_BYTES, options.chunk_bytes), line_prefix=spec.line_prefix,
    )  # fmt: skip
    with collector_paused():
        piece = _Piece(spec, log_format, options, reader, lines_before=0, bytes_before=0)
        for first, lines in reader:
            if piece.full() and log_format.starts_record(lines[0]):
                before = first - reader.first_line  # (a run of a block may follow a gap)
                yield piece.close(before)
                piece = _Piece(spec, log_format, options, reader, before, piece.bytes_end)
            piece.parser.feed(first, lines)
        yield piece.close(reader.lines, last=True)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector paused: a parse makes a dict per request and a string per
    line, none of them in a cycle, and the collector's passes over them cost about a tenth of
    a vLLM log's parse. Anything that does form a cycle is collected once it runs again."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Piece:
    """One piece of a chunk being parsed: its result, its parser, where it began."""

    def __init__(
        self,
        spec: ChunkSpec,
        log_format: LogFormat,
        options: IngestOptions,
        reader: LineReader,
        lines_before: int,
        bytes_before: int,
    ) -> None:
        self.result = ChunkResult(spec.path, spec.format, spec.start, spec.end or 0)
        self.result.rejects = reader.rejects = Rejects(spec.path)
        self.reader, self.options = reader, options
        self.lines_before, self.bytes_before = lines_before, bytes_before
        self.bytes_end = bytes_before
        self.parser = log_format.parser(self.result, options, Path(spec.path).name)

    def full(self) -> bool:
        return self.reader.bytes_read - self.bytes_before >= self.options.chunk_bytes

    def close(self, lines_seen: int, last: bool = False) -> ChunkResult:
        """Finish the piece: its lines are those up to ``lines_seen`` (numbered from the
        chunk's start, so reject samples are renumbered from the piece's)."""
        self.parser.finish()
        result, reader = self.result, self.reader
        result.head_ids = [h["request_id"] for h in result.heads if h.get("request_id")]
        for frame in result.head_frames:
            result.head_ids.extend(frame["request_id"].dropna().tolist())
        result.lines = lines_seen - self.lines_before
        result.rejects.renumber(-self.lines_before)
        self.bytes_end = reader.bytes_read
        result.bytes_read = self.bytes_end - self.bytes_before
        result.repaired, result.offset = reader.repaired, reader.offset
        return result


def merge_pieces(pieces: list[ChunkResult]) -> ChunkResult:
    """The pieces of one chunk as one result (heads, tails applied, counters summed)."""
    merged = pieces[0]
    for piece in pieces[1:]:
        merged.rejects.merge(piece.rejects, merged.lines)
        merged.heads.extend(piece.heads)
        merged.head_frames.extend(piece.head_frames)
        merged.head_ids.extend(piece.head_ids)
        merged.tails.update(piece.tails)
        merged.metrics.extend(piece.metrics)
        merged.ignored.update(piece.ignored)
        merged.cap_evidence.update(piece.cap_evidence)
        merged.longest_prompt = max(merged.longest_prompt, piece.longest_prompt)
        merged.longest_ids = max(merged.longest_ids, piece.longest_ids)
        merged.lines += piece.lines
        merged.bytes_read += piece.bytes_read
        merged.repaired, merged.offset = piece.repaired, piece.offset
        merged.last_ts = piece.last_ts or merged.last_ts
    return merged


def _parse_trace(
    spec: ChunkSpec, options: IngestOptions, trace: TraceFormat, partial_tail: bool
) -> ChunkResult:
    """A trace from ``spec.start`` on; an incremental run (``partial_tail`` False) leaves a
    half-written last line for the next run, as a log's chunks do."""
    result = ChunkResult(spec.path, spec.format, spec.start, spec.end or 0)
    path, rejects = Path(spec.path), Rejects(spec.path)
    result.rejects = rejects
    reader = LineReader(
        path, rejects, start=spec.start, first_line=spec.first_line,
        max_line_bytes=options.max_line_bytes, partial_tail=partial_tail,
        line_prefix=spec.line_prefix,
    )  # fmt: skip
    heads, result.counts = trace.read(path, rejects, options, reader)
    for row in heads:
        row.setdefault("source", trace.source)
    result.heads = heads
    result.lines, result.bytes_read, result.offset = reader.lines, reader.bytes_read, reader.offset
    rejects.renumber(1 - spec.first_line)  # numbered from the chunk's start, as a log piece's
    return result


_ARROW_OF = {"string": pa.string(), "Int64": pa.int64(), "UInt64": pa.uint64(),
             "Float64": pa.float64(), "boolean": pa.bool_()}  # fmt: skip

# The record contract's dtypes for what a head carries (``ts`` stays text until the file's year
# and zone are resolved; ``source`` and ``prefix_hashes`` are set later), plus the parser's own.
_HEAD_DTYPES = {
    **{c: t for c, t in RECORD_DTYPES.items() if c not in ("ts", "source", "prefix_hashes")},
    "_line": "Int64",
    "_ids_len": "Int64",
    "_ts_minus_s": "Float64",
}


#: a log piece's heads part: every head column, ``ts`` as the log printed it
HEAD_COLUMNS = (*HEAD_FIELDS, "_ts_minus_s", "source")
HEADS_SCHEMA = pa.schema(
    [(c, pa.int64()) if c == "_line" else (c, HASHES_TYPE) if c == "prefix_hashes"
     else (c, _ARROW_OF["string" if c in ("ts", "source") else _HEAD_DTYPES[c]])
     for c in HEAD_COLUMNS]
)  # fmt: skip


def heads_frame(
    heads: list[dict[str, object]], text_ts: bool, frames: Sequence[pd.DataFrame] = ()
) -> pd.DataFrame:
    """Heads as a typed DataFrame; ``ts`` stays text for log formats (resolved per file).
    ``frames`` are heads already read column-wise; all come out in line order.

    Built column by column from the Python values, so a u64-sized seed never passes through
    float64 (which would round it).
    """
    columns = list(HEAD_COLUMNS)
    # map(dict.get, ...) runs the per-row lookups in C: ~2x a comprehension on 25 columns
    data = {c: list(map(dict.get, heads, repeat(c))) for c in columns}
    frame = pd.DataFrame(
        {c: typed_values(v, _HEAD_DTYPES[c]) for c, v in data.items() if c in _HEAD_DTYPES}
    )
    frame["_line"] = frame["_line"].fillna(0).astype("int64")
    frame["source"] = pd.array(data["source"], dtype="string")
    frame["prefix_hashes"] = pd.Series(data["prefix_hashes"], dtype=object)
    if text_ts:
        frame["ts"] = pd.array(data["ts"], dtype="string")
    else:
        frame["ts"] = pd.to_datetime(pd.Series(data["ts"], dtype=object), utc=True)
    frame = frame[columns]
    if not frames:
        return frame
    parts = [frame, *(_head_columns(f, columns) for f in frames)]
    whole = pd.concat([p for p in parts if len(p)] or [frame], ignore_index=True)
    return whole.sort_values("_line", kind="stable", ignore_index=True)


def heads_table(heads: list[dict[str, object]], frames: Sequence[pd.DataFrame] = ()) -> pa.Table:
    """A log piece's heads as an Arrow table (:data:`HEADS_SCHEMA`, ``ts`` as text), built
    from the parser's values without a DataFrame in between (a third of what
    :func:`heads_frame` and its conversion cost); :func:`heads_of` reads it back as
    :func:`heads_frame` would give it, block hashes left in Arrow."""
    present = set().union(*heads)  # a column no head has is nulls, without a pass per head
    arrays = [
        _arrow_column(list(map(dict.get, heads, repeat(f.name))), f)
        if f.name in present
        else _absent_column(len(heads), f)
        for f in HEADS_SCHEMA
    ]
    table = pa.Table.from_arrays(arrays, schema=HEADS_SCHEMA)
    if not frames:
        return table
    parts = [table]
    for frame in frames:
        typed = _head_columns(frame, list(HEAD_COLUMNS))
        parts.append(pa.Table.from_pandas(typed, schema=HEADS_SCHEMA, preserve_index=False))
    whole = pa.concat_tables([p for p in parts if p.num_rows] or [table])
    return whole.take(pc.sort_indices(whole, [("_line", "ascending")]))  # a stable sort


def _absent_column(rows: int, field: pa.Field) -> pa.Array:
    """A head column no head has: nulls (``_line``: zeros, as :func:`_part_column` fills it).
    A vLLM log's heads lack 10 of the 25 columns: ~0.04 CPU-s a 100 MB log less than a pass
    over the heads for each (the keys of all heads are gathered in ~0.01)."""
    if field.name == "_line":
        return pa.array(np.zeros(rows, np.int64))
    return pa.nulls(rows, field.type)


def _arrow_column(values: list[object], field: pa.Field) -> pa.Array:
    """One head column's Python values as Arrow; a value Arrow will not take as that type
    (a bool among integers ...) goes through pandas' conversion, as :func:`heads_frame`'s."""
    if field.name == "prefix_hashes":  # chains of hex strings (anything else: a parser's bug)
        return pa.array(values, field.type, from_pandas=True)
    return _part_column(
        values, field, lambda: pa.array(typed_values(values, _head_dtype(field.name)))
    )


def _part_column(
    values: list[object], field: pa.Field, by_pandas: Callable[[], pa.Array]
) -> pa.Array:
    """Python values of a part's column as Arrow (NaN missing, as pandas has it), through
    ``by_pandas`` when Arrow will not take one of them as the column's type; ``_line`` has
    no missing values."""
    try:
        array = pa.array(values, field.type, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        array = by_pandas().cast(field.type)
    return pc.fill_null(array, 0) if field.name == "_line" else array


def heads_of(table: pa.Table) -> pd.DataFrame:
    """A :func:`heads_table` as a heads frame, in :func:`heads_frame`'s dtypes except
    ``prefix_hashes``, kept as Arrow lists (:func:`pipeline.records.hashes_column`)."""
    return _part_frame(table)


#: a part's Arrow types as pandas reads them (each head and metrics column's dtype, by type)
_PANDAS_OF = {
    **{arrow: pd.api.types.pandas_dtype(dtype) for dtype, arrow in _ARROW_OF.items()},
    HASHES_TYPE: pd.ArrowDtype(HASHES_TYPE),
}


def _part_frame(table: pa.Table) -> pd.DataFrame:
    """A part's table as a frame: ``_line`` as int64, block hashes as Arrow lists, every other
    column in the pandas dtype of its Arrow type (:data:`_PANDAS_OF`).

    One ``to_pandas`` call, one thread (the finishing processes keep the cores busy): a 1 GB
    vLLM log's parts in ~0.086 CPU-s, ~0.105 column by column."""
    line = table.column("_line").to_numpy()
    rest = table.drop_columns(["_line"])
    frame = rest.to_pandas(types_mapper=_PANDAS_OF.get, use_threads=False)
    frame.insert(table.column_names.index("_line"), "_line", line)
    return frame


def _head_dtype(column: str) -> str:
    return "string" if column in ("ts", "source") else _HEAD_DTYPES[column]


def _head_columns(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """A column-wise heads frame with every head column, in the dtypes of :func:`heads_frame`."""
    n = len(frame)
    out = {}
    for column in columns:
        if column in frame:
            out[column] = frame[column]
        elif column == "prefix_hashes":
            out[column] = pd.Series([None] * n, dtype=object)
        else:
            dtype = "string" if column in ("ts", "source") else _HEAD_DTYPES[column]
            out[column] = pd.Series(arrow_to_pandas(pa.nulls(n, _ARROW_OF[dtype]), dtype))
    typed = pd.DataFrame(out)
    typed["_line"] = typed["_line"].astype("int64")
    return typed


#: a log piece's metrics part: the metrics columns (``ts`` still text) and ``_line`` (for the
#: year's resolution)
_METRIC_TEXT = ("ts", "source", "instance")
METRICS_SCHEMA = pa.schema(
    [(c, pa.string()) if c in _METRIC_TEXT else (c, pa.float64()) for c in METRIC_FIELDS]
    + [("_line", pa.int64())]
)


def metrics_table(rows: list[dict[str, object]]) -> pa.Table:
    """Metrics rows as an Arrow table (:data:`METRICS_SCHEMA`), straight from the parser's
    values; :func:`metrics_of` reads it back as a frame."""
    arrays = [_metric_column(list(map(dict.get, rows, repeat(f.name))), f) for f in METRICS_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=METRICS_SCHEMA)


def _metric_column(values: list[object], field: pa.Field) -> pa.Array:
    """One metrics column as Arrow; values Arrow will not take as that type (an integer past
    2**53 ...) are cast by pandas, as they always were."""
    dtype = _metric_dtype(field.name)
    return _part_column(
        values, field, lambda: pa.array(pd.Series(values, dtype=object).astype(dtype))
    )


def metrics_of(table: pa.Table) -> pd.DataFrame:
    """A :func:`metrics_table` as a frame: numbers ``Float64``, text ``string``, ``_line``
    ``int64``."""
    return _part_frame(table)


def _metric_dtype(column: str) -> str:
    return "string" if column in _METRIC_TEXT else "Int64" if column == "_line" else "Float64"
