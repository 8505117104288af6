"""Azure LLM inference traces (``TIMESTAMP,ContextTokens,GeneratedTokens``): see
:mod:`pipeline.ingest.traces`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.ingest import traces
from pipeline.ingest.formats.base import TraceFormat
from pipeline.ingest.lines import LineReader
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.summary import Rejects

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
_ROW = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?,\d+,\d+$")


@dataclass(frozen=True)
class AzureFormat(TraceFormat):
    """A CSV of UTC timestamps and token counts; its header settles the format."""

    def matches(self, line: str) -> bool:
        return line.startswith(HEADER) or bool(_ROW.match(line))

    def claims(self, lines: Sequence[str], path: Path) -> bool:
        return bool(lines) and lines[0].startswith(HEADER)

    def read(
        self, path: Path, rejects: Rejects, options: IngestOptions, reader: LineReader
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return traces.azure_rows(path, rejects, reader), []


FORMAT = AzureFormat("azure", "trace", rank=50)
