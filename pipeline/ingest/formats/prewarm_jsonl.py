"""prewarm's own JSONL request format, for any other source: see
:mod:`pipeline.ingest.traces`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.ingest import traces
from pipeline.ingest.formats.base import TraceFormat
from pipeline.ingest.lines import LineReader
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.summary import Rejects


@dataclass(frozen=True)
class PrewarmJsonlFormat(TraceFormat):
    """One JSON object a line with the record columns, ``ts`` required."""

    def matches(self, line: str) -> bool:
        obj = traces.json_object(line)
        return obj is not None and "ts" in obj and "hash_ids" not in obj

    def read(
        self, path: Path, rejects: Rejects, options: IngestOptions, reader: LineReader
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return traces.jsonl_rows(path, rejects, options.block_size, reader), []


FORMAT = PrewarmJsonlFormat("prewarm-jsonl", "trace", rank=70)
