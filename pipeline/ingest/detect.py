"""Which format a file is in, from its first lines (``.gz`` looked into); override with
``IngestOptions.format``.

Each format (:mod:`pipeline.ingest.formats`) tests a line; a format whose head settles it (a
CSV header, a file-name rule) wins outright, else the format matching the most of the first
:data:`SAMPLE_LINES` non-blank lines. vLLM logs hold many lines of other loggers at start-up,
so a format needs only some matching lines, not all.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.ingest import formats
from pipeline.ingest.lines import read_head
from pipeline.ingest.vllm import ANSI

SAMPLE_LINES = 200
HEAD_BYTES = 256 << 10
#: every format's name, in detection order
FORMATS = formats.names()
LOG_FORMATS = tuple(f.name for f in formats.all_formats() if isinstance(f, formats.LogFormat))


def head_lines(path: Path, limit: int = SAMPLE_LINES) -> list[str]:
    """The first non-blank lines of a file, ANSI codes and a byte-order mark stripped, bad
    bytes replaced."""
    text = read_head(path, HEAD_BYTES).decode("utf-8", "replace").removeprefix("\ufeff")
    lines = [ANSI.sub("", line).rstrip("\r") for line in text.split("\n")[:-1] or [text]]
    return [line for line in lines if line.strip()][:limit]


def detect_format(path: str | Path) -> str | None:
    """The most likely format of ``path``, or ``None`` when no line of its head matches."""
    path = Path(path)
    lines = head_lines(path)
    if not lines:
        return None
    candidates = formats.all_formats()
    claimed = next((f for f in candidates if f.claims(lines, path)), None)
    if claimed is not None:
        return claimed.name
    scores = [(f.score(lines), -i, f.name) for i, f in enumerate(candidates)]
    best = max(scores)
    return best[2] if best[0] > 0 else None
