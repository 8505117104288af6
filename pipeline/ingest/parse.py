"""Cutting a file into chunks at line boundaries, and parsing one chunk.

A chunk is a byte range ``[start, end)`` of a plain file that begins at the start of a line
(for TGI text: at the start of an event, so a multi-line message is never split). ``.gz``
files and traces are one chunk each.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path

import pandas as pd

from pipeline.ingest import traces
from pipeline.ingest.chunk import HEAD_FIELDS, METRIC_FIELDS, ChunkResult
from pipeline.ingest.detect import LOG_FORMATS
from pipeline.ingest.lines import BLOCK_BYTES, LineReader, is_gzip
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.summary import Rejects
from pipeline.ingest.tgi import EVENT_START, TgiChunkParser
from pipeline.ingest.vllm import ANSI, VllmChunkParser
from pipeline.records import RECORD_DTYPES

ChunkParser = VllmChunkParser | TgiChunkParser

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


def _event_start_text(fmt: str, line: str) -> bool:
    """Whether a decoded line may start a chunk of ``fmt`` (TGI text: only an event)."""
    if fmt != "tgi-text":
        return True
    return EVENT_START.match(ANSI.sub("", line) if "\x1b" in line else line) is not None


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
    if spec.format not in LOG_FORMATS:
        result = ChunkResult(spec.path, spec.format, spec.start, spec.end or 0)
        result.rejects = Rejects(spec.path)
        yield _parse_trace(spec, options, result)
        return
    reader = LineReader(
        spec.path, Rejects(spec.path), start=spec.start, end=spec.end,
        max_line_bytes=options.max_line_bytes, partial_tail=partial_tail,
        block_bytes=min(BLOCK_BYTES, options.chunk_bytes),
    )  # fmt: skip
    piece = _Piece(spec, options, reader, lines_before=0, bytes_before=0)
    for first, lines in reader:
        if piece.full() and _event_start_text(spec.format, lines[0]):
            yield piece.close(reader.lines - len(lines))
            piece = _Piece(spec, options, reader, reader.lines - len(lines), piece.bytes_end)
        piece.parser.feed(first, lines)
    yield piece.close(reader.lines, last=True)


class _Piece:
    """One piece of a chunk being parsed: its result, its parser, where it began."""

    def __init__(
        self,
        spec: ChunkSpec,
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
        self.parser = _parser(spec, options, self.result)

    def full(self) -> bool:
        return self.reader.bytes_read - self.bytes_before >= self.options.chunk_bytes

    def close(self, lines_seen: int, last: bool = False) -> ChunkResult:
        """Finish the piece: its lines are those up to ``lines_seen`` (numbered from the
        chunk's start, so reject samples are renumbered from the piece's)."""
        self.parser.finish()
        result, reader = self.result, self.reader
        result.head_ids = [h["request_id"] for h in result.heads if h.get("request_id")]
        result.lines = lines_seen - self.lines_before
        result.rejects.renumber(-self.lines_before)
        self.bytes_end = reader.bytes_read
        result.bytes_read = self.bytes_end - self.bytes_before
        result.repaired, result.offset = reader.repaired, reader.offset
        return result


def _parser(spec: ChunkSpec, options: IngestOptions, result: ChunkResult) -> ChunkParser:
    if spec.format == "vllm":
        return VllmChunkParser(result, options.block_size, Path(spec.path).name)
    return TgiChunkParser(
        result, options.block_size, spec.format == "tgi-json", max_message=options.max_line_bytes
    )


def merge_pieces(pieces: list[ChunkResult]) -> ChunkResult:
    """The pieces of one chunk as one result (heads, tails applied, counters summed)."""
    merged = pieces[0]
    for piece in pieces[1:]:
        merged.rejects.merge(piece.rejects, merged.lines)
        merged.heads.extend(piece.heads)
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
