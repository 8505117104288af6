"""What a format module provides: how to recognise its files, where a record starts, how to
parse a chunk, how to turn its timestamps into UTC and which ``source`` its records carry.

The run, the chunk planner, the assembly and the finishing workers only call these methods;
none of them compares format names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.lines import LineReader
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.summary import Rejects


class ChunkParser(Protocol):
    """Parses the lines of one piece of a log into ``result`` (heads, tails, metrics)."""

    def feed(self, first_line: int, lines: Sequence[str]) -> None: ...

    def finish(self) -> ChunkResult: ...


@dataclass(frozen=True)
class FileFacts:
    """What a log's whole file decides for each of its pieces (picklable, for the workers):
    the year each piece starts in (year-less timestamps), a detected or given truncation cap,
    and the assumptions to report."""

    year_bases: tuple[int, ...] = ()
    cap: int | None = None
    notes: tuple[str, ...] = ()

    def without_cap(self) -> FileFacts:
        """The same facts for records whose prompts were never capped (orphan tails)."""
        return replace(self, cap=None)


@dataclass(frozen=True)
class Piece:
    """One parsed piece of a log as its rows' times are resolved: what its parser read, the
    file-wide facts, its index among the file's pieces and the run's options."""

    chunk: ChunkResult
    facts: FileFacts
    index: int
    options: IngestOptions


@dataclass(frozen=True)
class InputFormat:
    """A file format: its name (``--format``), detection and the records' ``source``."""

    name: str
    source: str
    #: detection order among formats that score alike (lower first)
    rank: int = 100

    def matches(self, line: str) -> bool:
        """Whether one (ANSI-stripped) head line looks like this format."""
        raise NotImplementedError

    def claims(self, lines: Sequence[str], path: Path) -> bool:
        """Whether the head settles the format by itself (a header, a file-name rule)."""
        return False

    def score(self, lines: Sequence[str], path: Path) -> int:
        """How many head lines of ``path`` look like this format."""
        return sum(1 for line in lines if self.matches(line))


@dataclass(frozen=True)
class LogFormat(InputFormat):
    """A log: cut into byte-range chunks, parsed line by line, finished per piece."""

    #: stats lines become engine-metrics rows (their timestamps resolved like the records')
    has_metrics: bool = False
    #: a piece's records need nothing from other pieces (no tails, no file-wide facts: its
    #: times resolve from its own rows), so it is finished in the process that parsed it
    pieces_stand_alone: bool = False

    def starts_record(self, line: str) -> bool:
        """Whether a chunk may start at this decoded line (a multi-line event is never cut)."""
        return True

    def parser(self, result: ChunkResult, options: IngestOptions, instance: str) -> ChunkParser:
        """A parser writing into ``result``; ``instance`` names the file (metrics rows)."""
        raise NotImplementedError

    def file_facts(
        self, chunks: Sequence[ChunkResult], options: IngestOptions, mtime: float
    ) -> FileFacts:
        """The file-wide facts once every piece is parsed."""
        return FileFacts()

    def resolve_ts(self, frame: pd.DataFrame, piece: Piece) -> pd.Series:
        """UTC arrival times of ``piece``'s rows (``ts`` as the log printed it)."""
        raise NotImplementedError

    def finalize(
        self, frame: pd.DataFrame, facts: FileFacts, options: IngestOptions
    ) -> pd.DataFrame:
        """Canonical records from resolved heads (format-specific fields first)."""
        from pipeline.ingest.assemble import finalize_log_records

        return finalize_log_records(frame, self.source, options)

    def orphan(self, row: dict[str, Any]) -> dict[str, Any]:
        """A record from follow-up lines whose defining line was not read."""
        return row


@dataclass(frozen=True)
class TraceFormat(InputFormat):
    """A trace: one chunk, one row a line, rows already in record (or counts) form, times
    absolute."""

    def read(
        self, path: Path, rejects: Rejects, options: IngestOptions, reader: LineReader
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Record rows and counts-shape rows of the lines ``reader`` reads (the whole file, or
        what an incremental run has not read yet)."""
        raise NotImplementedError


@dataclass
class Registry:
    """Formats by name, in detection order."""

    formats: dict[str, InputFormat] = field(default_factory=dict)

    def add(self, fmt: InputFormat) -> None:
        if fmt.name in self.formats:
            raise ValueError(f"format {fmt.name!r} registered twice")
        self.formats[fmt.name] = fmt
        self.formats = dict(sorted(self.formats.items(), key=lambda kv: kv[1].rank))
