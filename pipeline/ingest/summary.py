"""What an ingest run says about each file: format, records, rejects by reason, assumptions.

A bad line is never an exception: it is a counted reject with a few ``file:line`` samples, so an
operator can open the file at the right place.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

#: the reject reason of a line longer than the line cap (``--max-line-bytes``)
TOO_LONG = "line too long"

#: samples kept per reason; enough to find the pattern, small enough for a JSON summary
SAMPLES_PER_REASON = 3
#: characters of a rejected line kept in a sample
SAMPLE_CHARS = 160


@dataclass
class Rejects:
    """Rejected lines of one file, counted by reason, with a few samples per reason."""

    path: str = ""
    counts: Counter[str] = field(default_factory=Counter)
    #: reason -> [(line number, start of the line)]
    samples: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    #: every reject counted by ``add`` (cheap to read per line, unlike :attr:`total`)
    count: int = 0

    def add(self, reason: str, line_no: int, text: str | bytes = "", n: int = 1) -> None:
        """Count ``n`` rejects for ``reason``; keep a ``file:line`` sample while there is room."""
        self.counts[reason] += n
        self.count += n
        kept = self.samples.setdefault(reason, [])
        if len(kept) < SAMPLES_PER_REASON:
            if isinstance(text, bytes):
                text = text[:SAMPLE_CHARS].decode("utf-8", "replace")
            kept.append((line_no, text[:SAMPLE_CHARS]))

    def merge(self, other: Rejects, line_offset: int = 0) -> None:
        """Add ``other``'s counts and samples, its line numbers shifted by ``line_offset``.

        A chunk of a file numbers its lines from 1; merged in file order with the number of
        lines before it, its samples point at the right lines of the whole file.
        """
        self.counts.update(other.counts)
        for reason, kept in other.samples.items():
            mine = self.samples.setdefault(reason, [])
            room = max(0, SAMPLES_PER_REASON - len(mine))
            mine.extend((line + line_offset, text) for line, text in kept[:room])

    def renumber(self, shift: int) -> None:
        """Shift every sample's line number by ``shift``."""
        if shift:
            self.samples = {
                r: [(n + shift, t) for n, t in kept] for r, kept in self.samples.items()
            }

    def sample_lines(self) -> dict[str, list[str]]:
        """``reason -> ["file:line: text", ...]``."""
        return {
            reason: [f"{self.path}:{line}: {text}" for line, text in kept]
            for reason, kept in sorted(self.samples.items())
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready counts and samples (used to send a chunk's rejects between processes)."""
        return {
            "counts": dict(self.counts),
            "samples": {k: [list(s) for s in v] for k, v in self.samples.items()},
        }

    @classmethod
    def from_dict(cls, path: str, data: dict[str, Any]) -> Rejects:
        """Inverse of :meth:`to_dict`."""
        samples = {k: [(int(a), str(b)) for a, b in v] for k, v in data.get("samples", {}).items()}
        return cls(path, Counter(data.get("counts", {})), samples)

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
    #: lines understood but carrying nothing prewarm uses, by kind (banners, access lines...)
    ignored: Counter[str] = field(default_factory=Counter)
    #: lines with invalid UTF-8 that were decoded with replacement characters
    repaired: int = 0
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
            "ignored": dict(sorted(self.ignored.items())),
            "repaired_utf8_lines": self.repaired,
            "rejected": dict(sorted(self.rejects.counts.items())),
            "reject_samples": self.rejects.sample_lines(),
            "assumptions": list(self.assumptions),
        }
