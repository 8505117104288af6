"""ServeGen per-client rate series (``chunk-<n>-trace.csv``): counts, not requests; see
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

_ROW = re.compile(r"\d+(?:\.\d+)?,\d+(?:\.\d+)?(?:e-?\d+)?,[^,]*,[A-Za-z]*,[^,]*,[^,]*$")


def _named(path: Path) -> bool:
    """Whether ``path``'s name is a ServeGen client file's (``chunk-<n>-trace.csv[.gz]``)."""
    return traces.servegen_client(path) is not None


@dataclass(frozen=True)
class ServeGenFormat(TraceFormat):
    """Headerless rows ``window_start_s,rate,iat_cv,dist,p1,p2``; the file name names the
    client, and settles the format when some rows match."""

    def matches(self, line: str) -> bool:
        return bool(_ROW.match(line))

    def claims(self, lines: Sequence[str], path: Path) -> bool:
        return _named(path) and any(self.matches(line) for line in lines)

    def score(self, lines: Sequence[str], path: Path) -> int:
        """0 for a file whose name names no client: its rows alone are any numeric CSV's."""
        return super().score(lines, path) if _named(path) else 0

    def read(
        self, path: Path, rejects: Rejects, options: IngestOptions, reader: LineReader
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return [], traces.servegen_rows(path, rejects, traces.epoch_of(options.trace_epoch), reader)


FORMAT = ServeGenFormat("servegen", "trace", rank=60)
