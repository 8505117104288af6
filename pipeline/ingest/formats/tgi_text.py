"""Hugging Face TGI router logs as text, v1 to v3 (FORMATS.md section 2): the parser is
:class:`pipeline.ingest.tgi.parser.TgiChunkParser`. An event starts with its RFC 3339
timestamp and may go on over lines (a chat template's ``Input:``), so a chunk starts only at an
event; a record's time is the event's minus its ``total_time`` (its arrival)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pandas as pd

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.formats.base import ChunkParser, LogFormat, Piece
from pipeline.ingest.lines import ANSI
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.tgi import EVENT_START, TgiChunkParser, arrival_ts


@dataclass(frozen=True)
class TgiFormat(LogFormat):
    """A TGI router log, text or JSON: one parser for both, records timed at their arrival."""

    #: one JSON event a line (``--json-output``) rather than text events
    json_lines: ClassVar[bool] = False

    def parser(self, result: ChunkResult, options: IngestOptions, instance: str) -> ChunkParser:
        return TgiChunkParser(
            result, options.block_size, self.json_lines, max_message=options.max_line_bytes
        )

    def resolve_ts(self, frame: pd.DataFrame, piece: Piece) -> pd.Series:
        return arrival_ts(frame)


@dataclass(frozen=True)
class TgiTextFormat(TgiFormat):
    """TGI's default text output, plain or with ANSI codes."""

    def matches(self, line: str) -> bool:
        return EVENT_START.match(line) is not None

    def starts_record(self, line: str) -> bool:
        return EVENT_START.match(ANSI.sub("", line) if "\x1b" in line else line) is not None


FORMAT = TgiTextFormat("tgi-text", "tgi", rank=20, pieces_stand_alone=True)
