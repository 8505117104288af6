"""What an ingest run says about each file: format, records, rejects by reason, assumptions.

A bad line is never an exception: it is a counted reject with a few ``file:line`` samples, so an
operator can open the file at the right place.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: samples kept per reason; enough to find the pattern, small enough for a JSON summary
SAMPLES_PER_REASON = 3
#: characters of a rejected line kept in a sample
SAMPLE_CHARS = 160


@dataclass
class Rejects:
    """Rejected lines of one file, counted by reason, with a few samples per reason."""

    path: str = ""
    counts: Counter[str] = field(default_factory=Counter)
    samples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, line_no: int, text: str | bytes = "", n: int = 1) -> None:
        """Count ``n`` rejects for ``reason``; keep a ``file:line`` sample while there is room."""
        self.counts[reason] += n
        kept = self.samples.setdefault(reason, [])
        if len(kept) < SAMPLES_PER_REASON:
            if isinstance(text, bytes):
                text = text[:SAMPLE_CHARS].decode("utf-8", "replace")
            kept.append(f"{self.path}:{line_no}: {text[:SAMPLE_CHARS]}")

    def merge(self, other: Rejects) -> None:
        """Add ``other``'s counts and samples (chunks of one file are merged in file order)."""
        self.counts.update(other.counts)
        for reason, kept in other.samples.items():
            mine = self.samples.setdefault(reason, [])
            mine.extend(kept[: max(0, SAMPLES_PER_REASON - len(mine))])

    @property
    def total(self) -> int:
        """All rejected lines."""
        return sum(self.counts.values())


@dataclass
class FileSummary:
    """The outcome of ingesting one file."""

    path: str
    format: str
    records: int = 0
    lines: int = 0
    bytes_read: int = 0
    metrics: int = 0
    rejects: Rejects = field(default_factory=Rejects)
    #: lines understood but carrying nothing prewarm uses (start-up banners, other loggers)
    ignored: int = 0
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, as ``prewarm ingest --json`` prints it."""
        return {
            "path": self.path,
            "format": self.format,
            "records": self.records,
            "metrics": self.metrics,
            "lines": self.lines,
            "bytes_read": self.bytes_read,
            "ignored_lines": self.ignored,
            "rejected": dict(sorted(self.rejects.counts.items())),
            "reject_samples": {k: list(v) for k, v in sorted(self.rejects.samples.items())},
            "assumptions": list(self.assumptions),
        }
