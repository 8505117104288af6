"""Which files an ingest reads and how each is planned: files named and found in folders
(symlinks, FIFOs and devices inside a folder left out, with the reason), each file's format,
start offset (an incremental run resumes) and chunks; and the summary of a file in no known
format."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import BadInputError
from pipeline.ingest.detect import detect
from pipeline.ingest.lines import LineReader, read_head
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.parse import ChunkSpec, plan_chunks
from pipeline.ingest.state import FileState, IngestState, identify
from pipeline.ingest.summary import FileSummary, Rejects

UNKNOWN = "format not recognised"
#: a file that starts with a UTF-16 byte-order mark (Windows PowerShell's ``>`` writes one)
UTF16 = "UTF-16 text, not UTF-8 (convert it: iconv -f UTF-16 -t UTF-8)"


@dataclass
class FilePlan:
    """One input file: its format, where reading starts, its chunks."""

    path: Path
    format: str | None
    state: FileState
    resume_note: str
    chunks: list[ChunkSpec] = field(default_factory=list)

    @property
    def line_prefix(self) -> str | None:
        """The container runtime's prefix of its lines, as its chunks cut it (None: none)."""
        return self.chunks[0].line_prefix if self.chunks else None


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files named, and every non-hidden regular file under folders named, in a stable order."""
    return find_inputs(paths)[0]


def find_inputs(paths: Iterable[str | Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Files to read, and entries of named folders left out with the reason.

    A file named on the command line is read even through a symlink (its owner chose it);
    inside a folder, symlinks are not followed (one could lead out of the folder, or name a
    file twice) and FIFOs, sockets and devices are left out (reading one may block forever).
    A named path that is no regular file is a :class:`BadInputError` naming what it is.
    """
    files: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found, left_out = _folder_files(path)
            files.extend(found)
            skipped.extend(left_out)
        elif path.is_file():
            files.append(path)
        else:
            raise BadInputError(_not_a_file(path), where=str(path))
    return files, skipped


def _not_a_file(path: Path) -> str:
    if path.is_symlink() and not path.exists():
        return f"a symlink to {os.readlink(path)!r}, which does not exist"
    if not path.exists():
        return "no such file or folder"
    kind = _special_kind(path.stat().st_mode)
    return f"{kind}, not a regular file: ingest reads files (copy the stream into one first)"


def _special_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a file or folder"


def _folder_files(root: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    files: list[Path] = []
    skipped: list[tuple[Path, str]] = []
    for folder, dirs, names in os.walk(root):  # followlinks=False: linked folders not entered
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for d in dirs:
            if (here / d).is_symlink():
                skipped.append((here / d, "symlink to a folder: not followed"))
        for name in sorted(names):
            path = here / name
            if name.startswith("."):
                continue
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                skipped.append((path, "symlink inside a folder: not followed"))
            elif stat.S_ISREG(mode):
                files.append(path)
            else:
                skipped.append((path, f"{_special_kind(mode)}: not read"))
    return sorted(files), skipped


def plan_file(path: Path, options: IngestOptions, state: IngestState | None) -> FilePlan:
    """Format, start offset (incremental) and chunks of one file."""
    if state is not None:
        file_state, note = state.resume(path)
    else:
        file_state, note = identify(path), "whole file"
    fmt, line_prefix = detect(path, options.format or file_state.format, options.source)
    file_state.format = fmt
    plan = FilePlan(path, fmt, file_state, note)
    if fmt is not None and file_state.size > 0:
        plan.chunks = plan_chunks(
            path, fmt, options.chunk_bytes, file_state.offset, file_state.lines + 1, line_prefix
        )
    return plan


def unknown_summary(plan: FilePlan, options: IngestOptions, incremental: bool) -> FileSummary:
    """A file in no known format (or empty): count its lines as rejects, read nothing else.
    An incremental run leaves a half-written last line out (a growing file's first line, not
    yet whole, is no reject: it is detected once it is)."""
    summary = FileSummary(str(plan.path), "empty" if plan.state.size == 0 else "unknown")
    summary.rejects = Rejects(str(plan.path))
    if plan.state.size == 0:
        summary.assumptions.append("empty file")
        return summary
    reader = LineReader(  # its own rejects (a line too long, a damaged stream) count too
        plan.path, summary.rejects, max_line_bytes=options.max_line_bytes,
        partial_tail=not incremental,
    )  # fmt: skip
    reason = UTF16 if read_head(plan.path, 2) in (b"\xff\xfe", b"\xfe\xff") else UNKNOWN
    for first, lines in reader:
        for i, line in enumerate(lines):
            if line.strip():
                summary.rejects.add(reason, first + i, line)
    summary.lines = reader.lines
    return summary
