"""The Mooncake conversation trace (``conversation_trace.jsonl``): see
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
class MooncakeFormat(TraceFormat):
    """One JSON object a line with ``timestamp`` (ms), lengths and 512-token ``hash_ids``."""

    def matches(self, line: str) -> bool:
        obj = traces.json_object(line)
        return obj is not None and "hash_ids" in obj and "input_length" in obj

    def read(
        self, path: Path, rejects: Rejects, options: IngestOptions, reader: LineReader
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return traces.mooncake_rows(path, rejects, traces.epoch_of(options.trace_epoch), reader), []


FORMAT = MooncakeFormat("mooncake", "trace", rank=40)
