"""Which format a file is in, from its first lines (``.gz`` looked into); override with
``IngestOptions.format``.

Each format (:mod:`pipeline.ingest.formats`) tests a line; a format whose head settles it (a
CSV header, a file-name rule) wins outright, else the format matching the most of the first
:data:`SAMPLE_LINES` non-blank lines. vLLM logs hold many lines of other loggers at start-up,
so a format needs only some matching lines, not all.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.ingest import formats, line_prefixes
from pipeline.ingest.lines import ANSI, read_head

SAMPLE_LINES = 200
HEAD_BYTES = 256 << 10
#: every format's name, in detection order
FORMATS = formats.names()
LOG_FORMATS = tuple(f.name for f in formats.all_formats() if isinstance(f, formats.LogFormat))


def _head(path: Path) -> list[str]:
    """The lines of a file's head as they are (bad bytes replaced, no byte-order mark)."""
    text = read_head(path, HEAD_BYTES).decode("utf-8", "replace").removeprefix("\ufeff")
    return [line.rstrip("\r") for line in text.split("\n")[:-1] or [text]]


def _plain(lines: list[str]) -> list[str]:
    """``lines`` without ANSI codes, blank ones left out."""
    return [plain for line in lines if (plain := ANSI.sub("", line)).strip()]


def detect_format(path: str | Path) -> str | None:
    """The most likely format of ``path``, or ``None`` when no line of its head matches."""
    return detect(path)[0]


def detect(
    path: str | Path, fmt: str | None = None, source: str | None = None
) -> tuple[str | None, str | None]:
    """The most likely format of ``path`` (``fmt`` when given; with ``source``, one of the
    formats whose records carry it, the first when none matches) and the line prefix its
    lines carry (:mod:`~pipeline.ingest.line_prefixes`; ``None``: none): a prefix is taken
    when nearly every head line starts with it and more of them read as a format without it."""
    path = Path(path)
    candidates = [formats.get(fmt)] if fmt is not None else formats.of_source(source)
    if fmt is None and source is not None:
        fmt = candidates[0].name
    head = _head(path)
    lines = _plain(head)[:SAMPLE_LINES]
    if not lines:
        return fmt, None
    best, prefix = _best(lines, path, candidates), None
    for name in line_prefixes.candidates(lines):  # longest first: the first of equals wins
        found = _best(_unprefixed(head, lines, name), path, candidates)
        # alike without a prefix: the lines read the same either way (the prefix is taken)
        if found[0] > 0 and (found > best or (found == best and prefix is None)):
            best, prefix = found, name
    return (best[2] if best[0] > 0 else fmt), prefix


def _unprefixed(head: list[str], lines: list[str], name: str) -> list[str]:
    """The head ``lines`` without the prefix ``name``; under a runtime that cuts long lines,
    the pieces of the ``head`` they came from joined first (a colour code may lie in two
    pieces)."""
    if name not in line_prefixes.PIECED:
        return line_prefixes.stripped(lines, name)
    pieces = [line for line in head if line.strip()][: len(lines)]
    return _plain(line_prefixes.unprefixed(pieces, name))


def _best(
    lines: list[str], path: Path, candidates: list[formats.InputFormat]
) -> tuple[int, int, str | None]:
    """The format that reads the most of ``lines`` (one whose head settles it first), as
    ``(score, -rank, name)``; a score of 0: none."""
    claimed = next((f for f in candidates if f.claims(lines, path)), None)
    if claimed is not None:
        return len(lines) + 1, 0, claimed.name
    return max((f.score(lines, path), -i, f.name) for i, f in enumerate(candidates))
