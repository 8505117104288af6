"""Hugging Face TGI router logs with ``--json-output`` (FORMATS.md section 2): one JSON
event a line, fields of the request's spans included; read by
:class:`pipeline.ingest.tgi.parser.TgiChunkParser` like the text form, and timed the same
way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pipeline.ingest.formats.tgi_text import TgiFormat
from pipeline.ingest.traces import json_object


@dataclass(frozen=True)
class TgiJsonFormat(TgiFormat):
    """``{"timestamp": ..., "level": ..., "target": ..., "span": {...}, "spans": [...]}``."""

    json_lines: ClassVar[bool] = True

    def matches(self, line: str) -> bool:
        obj = json_object(line)
        return obj is not None and "timestamp" in obj and "level" in obj and "target" in obj


FORMAT = TgiJsonFormat("tgi-json", "tgi", rank=30)
