"""Hugging Face TGI router logs with ``--json-output`` (FORMATS.md section 2): one JSON
event a line, fields of the request's spans included; read by
:class:`pipeline.ingest.tgi.TgiChunkParser` like the text form, and timed the same way."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.formats.base import ChunkParser, FileFacts, LogFormat
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.tgi import TgiChunkParser, arrival_ts


def _event(line: str) -> dict[str, object] | None:
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class TgiJsonFormat(LogFormat):
    """``{"timestamp": ..., "level": ..., "target": ..., "span": {...}, "spans": [...]}``."""

    def matches(self, line: str) -> bool:
        obj = _event(line)
        return obj is not None and "timestamp" in obj and "level" in obj and "target" in obj

    def parser(self, result: ChunkResult, options: IngestOptions, instance: str) -> ChunkParser:
        return TgiChunkParser(
            result, options.block_size, json_lines=True, max_message=options.max_line_bytes
        )

    def resolve_ts(
        self,
        frame: pd.DataFrame,
        chunk: ChunkResult,
        facts: FileFacts,
        index: int,
        options: IngestOptions,
    ) -> pd.Series:
        return arrival_ts(frame)


FORMAT = TgiJsonFormat("tgi-json", "tgi", rank=30)
