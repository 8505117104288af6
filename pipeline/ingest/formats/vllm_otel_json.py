"""vLLM logs in its OpenTelemetry JSON form (FORMATS.md 1.10: ``vllm/logging_utils/
oteljson.py``, newest main, opt-in): one JSON object a line, ``timestamp`` (UTC, ISO 8601),
``severity_text``, ``severity_number``, ``body`` (the message the text form prints after its
envelope), ``logger``, ``service.name`` and, where they apply, ``exception``, ``trace_id``,
``span_id``.

The body is read by :class:`pipeline.ingest.vllm.parser.VllmChunkParser` as the text form's message
is: the same joins, fields and ``--max-log-len`` detection. The time is the record's own, with
its year and zone: nothing is assumed. uvicorn's lines (``logger`` ``uvicorn.*``) carry an
access line's text without its level prefix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import pandas as pd

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.formats.base import ChunkParser, FileFacts, Piece
from pipeline.ingest.formats.vllm import VllmFormat, cap_facts
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.vllm.envelope import BLANK
from pipeline.ingest.vllm.parser import VllmChunkParser

#: the OTel severity texts vLLM writes, as the text form's level names
LEVELS = {"DEBUG": "DEBUG", "INFO": "INFO", "WARN": "WARNING", "ERROR": "ERROR",
          "FATAL": "CRITICAL"}  # fmt: skip
#: an access line's message (uvicorn's ``'%s - "%s %s HTTP/%s" %d'``)
_ACCESS = re.compile(
    r"(?P<client>\S*) - \"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+\" (?P<status>\d{3})"
)
NOT_OTEL = "not a vLLM OTel JSON line"


class Entry(msgspec.Struct):
    """The fields of a line that are read."""

    timestamp: str
    severity_text: str
    body: str
    logger: str = ""


_DECODER = msgspec.json.Decoder(Entry)


def entry_of(line: str) -> Entry | None:
    """The line's entry (``None``: not JSON, or not this shape)."""
    if not line.startswith("{"):
        return None
    try:
        return _DECODER.decode(line)
    except msgspec.DecodeError:
        return None


class VllmOtelChunkParser(VllmChunkParser):
    """:class:`VllmChunkParser` fed each line's body, level and time."""

    def feed(self, first_line: int, lines: Sequence[str]) -> None:
        for line_no, line in enumerate(lines, first_line):
            entry = entry_of(line)
            level = LEVELS.get(entry.severity_text) if entry is not None else None
            if entry is None or level is None:
                reason = BLANK if not line.strip() else NOT_OTEL
                self.out.rejects.add(reason, line_no, line)
            elif entry.logger.startswith("uvicorn"):
                self._uvicorn(entry, line_no)
            else:
                self._enveloped(entry.body, level, entry.timestamp, line_no)

    def _uvicorn(self, entry: Entry, line_no: int) -> None:
        access = _ACCESS.match(entry.body) if entry.logger == "uvicorn.access" else None
        if access is None:
            self.out.ignored["uvicorn line"] += 1
            return
        self.last_ts = entry.timestamp  # (an access line has a time of its own here)
        self._access(access, line_no)

    def _track_year(self, ts: str, line_no: int) -> None:
        """The file's first and last times (each carries its year: no rollover to find)."""
        if self.out.first_ts is None:
            self.out.first_ts = ts
        self.out.last_ts = ts


@dataclass(frozen=True)
class VllmOtelJsonFormat(VllmFormat):
    """``{"timestamp": ..., "severity_text": ..., "body": ..., "logger": ...}``."""

    def matches(self, line: str) -> bool:
        entry = entry_of(line)
        return entry is not None and entry.severity_text in LEVELS

    def parser(self, result: ChunkResult, options: IngestOptions, instance: str) -> ChunkParser:
        return VllmOtelChunkParser(result, options.block_size, instance)

    def file_facts(
        self, chunks: Sequence[ChunkResult], options: IngestOptions, mtime: float
    ) -> FileFacts:
        cap, notes = cap_facts(chunks, options)
        return FileFacts((), cap, notes)

    def resolve_ts(self, frame: pd.DataFrame, piece: Piece) -> pd.Series:
        stamps = pd.to_datetime(frame["ts"].astype(object), utc=True, format="ISO8601",
                                errors="coerce")  # fmt: skip
        return stamps.astype("datetime64[us, UTC]")


FORMAT = VllmOtelJsonFormat("vllm-otel-json", "vllm", rank=20, has_metrics=True)
