"""Incremental ingestion: how far each file was read, and how to know it is the same file.

A file is known by its *content identity*: a hash of its first bytes (decompressed for
``.gz``), with the device and inode as a hint. On the next run:

* same identity, grown: read from the remembered offset (never past the last newline);
* same path, new inode or shorter than the offset or a different head: rotated or
  truncated — read from the start;
* a new path whose head matches a known file (``app.log`` renamed to ``app.log.1``, or
  compressed to ``app.log.1.gz``): continue at that file's offset — what was read before is
  not read twice.

The state is a small JSON file, written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import BadInputError
from pipeline.ingest.lines import is_compressed, read_head

#: bytes of a file's head that name its content; a log's first line alone is usually unique
HEAD_BYTES = 4096
#: request ids remembered per file, so follow-up lines in the next run join nothing twice
RECENT_IDS = 2000
STATE_VERSION = 1


@dataclass
class FileState:
    """What one earlier run knew about one file."""

    path: str
    device: int
    inode: int
    size: int
    mtime: float
    head_hash: str
    head_len: int
    offset: int = 0
    lines: int = 0
    format: str | None = None
    recent_ids: list[str] = field(default_factory=list)


def _head(path: Path) -> bytes:
    return read_head(path, HEAD_BYTES)


def identify(path: str | Path) -> FileState:
    """A fresh :class:`FileState` for ``path`` (offset 0)."""
    path = Path(path)
    info = path.stat()
    head = _head(path)
    return FileState(
        path=str(path),
        device=info.st_dev,
        inode=info.st_ino,
        size=info.st_size,
        mtime=info.st_mtime,
        head_hash=hashlib.blake2b(head, digest_size=12).hexdigest(),
        head_len=len(head),
    )


def _same_content(old: FileState, new: FileState, path: Path) -> bool:
    if old.head_len == new.head_len:
        return old.head_hash == new.head_hash
    if old.head_len > new.head_len:
        return False
    return hashlib.blake2b(_head(path)[: old.head_len], digest_size=12).hexdigest() == old.head_hash


def _grown(old: FileState, now: FileState, path: Path) -> bool:
    """``path`` holds what ``old`` held, and at least as much of it."""
    longer = is_compressed(path) or now.size >= old.offset
    return longer and _same_content(old, now, path)


class IngestState:
    """Offsets per file, loaded from and saved to one JSON file."""

    def __init__(self, files: dict[str, FileState] | None = None) -> None:
        self.files = files or {}

    @classmethod
    def load(cls, path: str | Path) -> IngestState:
        """Read a state file; a missing file is an empty state."""
        path = Path(path)
        if not path.exists():
            return cls()
        try:
            data = json.loads(path.read_text())
            files = {k: FileState(**v) for k, v in data["files"].items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise BadInputError(f"unreadable ingest state: {exc}", where=str(path)) from exc
        return cls(files)

    def save(self, path: str | Path) -> None:
        """Write atomically (temp file + rename)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        data: dict[str, Any] = {"version": STATE_VERSION,
                                "files": {k: asdict(v) for k, v in self.files.items()}}  # fmt: skip
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)

    def resume(self, path: str | Path) -> tuple[FileState, str]:
        """Where to start reading ``path`` now, and why (for the summary)."""
        path = Path(path)
        now = identify(path)
        old = self.files.get(str(path))
        same_file = old is not None and (old.device, old.inode) == (now.device, now.inode)
        if old is not None and (same_file or is_compressed(path)) and _grown(old, now, path):
            return self._continue(now, old), "continued"
        for other in self.files.values():
            if other.path != str(path) and _grown(other, now, path):
                return self._continue(now, other), f"continued from {other.path}"
        reason = "new file" if old is None else "rotated or truncated: read from the start"
        return now, reason

    @staticmethod
    def _continue(now: FileState, old: FileState) -> FileState:
        now.offset, now.lines, now.format = old.offset, old.lines, old.format
        now.recent_ids = list(old.recent_ids)
        return now

    def update(self, state: FileState) -> None:
        """Remember ``state`` for its path (recent ids capped at :data:`RECENT_IDS`)."""
        state.recent_ids = state.recent_ids[-RECENT_IDS:]
        self.files[state.path] = state
