"""Cutting a file into chunks at line boundaries, and parsing one chunk.

A chunk is a byte range ``[start, end)`` of a plain file that begins at the start of a line
(for TGI text: at the start of an event, so a multi-line message is never split). ``.gz``
files and traces are one chunk each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path

import pandas as pd

from pipeline.ingest import traces
from pipeline.ingest.chunk import HEAD_FIELDS, METRIC_FIELDS, ChunkResult
from pipeline.ingest.detect import LOG_FORMATS
from pipeline.ingest.lines import LineReader, is_gzip
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.summary import Rejects
from pipeline.ingest.tgi import EVENT_START, TgiChunkParser
from pipeline.ingest.vllm import ANSI, VllmChunkParser
from pipeline.records import RECORD_DTYPES

#: how far past a planned cut to look for the start of a line / an event
_BOUNDARY_SCAN = 8 << 20
_ANSI_START = re.compile(rb"^(?:\x1b\[[0-9;]*m)*\d{4}-\d\d-\d\dT")


@dataclass(frozen=True)
class ChunkSpec:
    """One byte range of one file, in a known format; ``index`` orders chunks of a file."""

    path: str
    format: str
    start: int
    end: int | None
    index: int = 0


def _event_start(fmt: str, line: bytes) -> bool:
    if fmt != "tgi-text":
        return True
    if not _ANSI_START.match(line):
        return False
    text = ANSI.sub("", line.decode("utf-8", "replace"))
    return EVENT_START.match(text) is not None


def _next_boundary(path: Path, fmt: str, offset: int) -> int | None:
    """The first line (event) start at or after ``offset``; ``None`` if none close by."""
    with open(path, "rb") as handle:
        handle.seek(max(0, offset - 1))
        data = handle.read(_BOUNDARY_SCAN)
    pos = data.find(b"\n")
    while 0 <= pos < len(data) - 1:
        end = data.find(b"\n", pos + 1)
        line = data[pos + 1 : end if end >= 0 else len(data)]
        if _event_start(fmt, line):
            return max(0, offset - 1) + pos + 1
        if end < 0:
            return None
        pos = end
    return None


def plan_chunks(path: str | Path, fmt: str, chunk_bytes: int, start: int = 0) -> list[ChunkSpec]:
    """Chunks of ``path`` from byte ``start`` on, about ``chunk_bytes`` each."""
    path = Path(path)
    size = path.stat().st_size
    if fmt not in LOG_FORMATS or is_gzip(path) or size - start <= chunk_bytes:
        return [ChunkSpec(str(path), fmt, start, None)]
    cuts = [start]
    target = start + chunk_bytes
    while target < size:
        cut = _next_boundary(path, fmt, target)
        if cut is None or cut >= size:
            break
        if cut > cuts[-1]:
            cuts.append(cut)
        target = max(cut, target) + chunk_bytes
    ends: list[int | None] = [*cuts[1:], None]
    return [
        ChunkSpec(str(path), fmt, a, b, i) for i, (a, b) in enumerate(zip(cuts, ends, strict=True))
    ]


def parse_chunk(spec: ChunkSpec, options: IngestOptions, partial_tail: bool = True) -> ChunkResult:
    """Parse one chunk; bad lines are counted, never raised."""
    result = ChunkResult(spec.path, spec.format, spec.start, spec.end or 0)
    result.rejects = Rejects(spec.path)
    if spec.format not in LOG_FORMATS:
        return _parse_trace(spec, options, result)
    reader = LineReader(
        spec.path,
        result.rejects,
        start=spec.start,
        end=spec.end,
        max_line_bytes=options.max_line_bytes,
        partial_tail=partial_tail,
    )
    parser: VllmChunkParser | TgiChunkParser
    if spec.format == "vllm":
        parser = VllmChunkParser(result, options.block_size, Path(spec.path).name)
    else:
        parser = TgiChunkParser(result, options.block_size, spec.format == "tgi-json")
    for first, lines in reader:
        parser.feed(first, lines)
    parser.finish()
    result.lines, result.bytes_read = reader.lines, reader.bytes_read
    result.repaired, result.offset = reader.repaired, reader.offset
    return result


def _parse_trace(spec: ChunkSpec, options: IngestOptions, result: ChunkResult) -> ChunkResult:
    path, rejects = Path(spec.path), result.rejects
    epoch = pd.Timestamp(options.trace_epoch) if options.trace_epoch else traces.TRACE_EPOCH
    if epoch.tzinfo is None:
        epoch = epoch.tz_localize("UTC")
    if spec.format == "mooncake":
        result.heads = traces.mooncake_rows(path, rejects, epoch)
    elif spec.format == "azure":
        result.heads = traces.azure_rows(path, rejects)
    elif spec.format == "servegen":
        result.counts = traces.servegen_rows(path, rejects, epoch)
    else:
        result.heads = traces.jsonl_rows(path, rejects, options.block_size)
    for row in result.heads:
        row.setdefault("source", "trace")
    result.lines = len(result.heads) + len(result.counts) + rejects.total
    result.bytes_read = result.offset = path.stat().st_size
    return result


# The record contract's dtypes for what a head carries (``ts`` stays text until the file's year
# and zone are resolved; ``source`` and ``prefix_hashes`` are set later), plus the parser's own.
_HEAD_DTYPES = {
    **{c: t for c, t in RECORD_DTYPES.items() if c not in ("ts", "source", "prefix_hashes")},
    "_line": "Int64",
    "_ids_len": "Int64",
    "_ts_minus_s": "Float64",
}


def heads_frame(heads: list[dict[str, object]], text_ts: bool) -> pd.DataFrame:
    """Heads as a typed DataFrame; ``ts`` stays text for log formats (resolved per file).

    Built column by column from the Python values, so a u64-sized seed never passes through
    float64 (which would round it).
    """
    columns = [*HEAD_FIELDS, "_ts_minus_s", "source"]
    # map(dict.get, ...) runs the per-row lookups in C: ~2x a comprehension on 25 columns
    data = {c: list(map(dict.get, heads, repeat(c))) for c in columns}
    frame = pd.DataFrame(
        {c: pd.array(v, dtype=_HEAD_DTYPES[c]) for c, v in data.items() if c in _HEAD_DTYPES}
    )
    frame["_line"] = frame["_line"].fillna(0).astype("int64")
    frame["source"] = pd.array(data["source"], dtype="string")
    frame["prefix_hashes"] = pd.Series(data["prefix_hashes"], dtype=object)
    if text_ts:
        frame["ts"] = pd.array(data["ts"], dtype="string")
    else:
        frame["ts"] = pd.to_datetime(pd.Series(data["ts"], dtype=object), utc=True)
    return frame[columns]


def metrics_frame(rows: list[dict[str, object]]) -> pd.DataFrame:
    """Metrics rows as a DataFrame (``ts`` still text, ``_line`` kept for year resolution)."""
    columns = [*METRIC_FIELDS, "_line"]
    frame = (
        pd.DataFrame.from_records(rows, columns=columns) if rows else pd.DataFrame(columns=columns)
    )
    numeric = [c for c in METRIC_FIELDS if c not in ("ts", "source", "instance")]
    frame[numeric] = frame[numeric].astype("Float64")
    frame[["ts", "source", "instance"]] = frame[["ts", "source", "instance"]].astype("string")
    frame["_line"] = frame["_line"].fillna(0).astype("int64")
    return frame
