"""Moving an installation: copy the shared state of one ``data_dir`` into another (a folder
into a bucket, and back) and check every object arrived whole.

What is copied is shared state only: observations, models, KV-event state, predictions, topic
mixes. Host-local things (template-repository clones under ``repos/``, chunked-ingest parts
under ``ingest/``, the beat's schedule file, temporary files) are left behind: each host
rebuilds them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import ConsistencyError
from tasks.adapters.shared_store import SharedStore

#: top-level names under a ``data_dir`` that are one host's own, not shared state
HOST_LOCAL = ("repos", "ingest", "celerybeat-schedule")


def shared_keys(store: SharedStore) -> list[str]:
    """Every key of shared state under ``store`` (host-local things and temporaries left out)."""
    return [key for key in store.walk("") if _shared(key)]


def _shared(key: str) -> bool:
    parts = key.split("/")
    if parts[0] in HOST_LOCAL or parts[0].startswith("celerybeat-schedule"):
        return False
    return not any(part.startswith(".") for part in parts) and not key.endswith(".tmp")


@dataclass
class CopyReport:
    """What a copy did: objects and bytes copied, and each checked by its SHA-256."""

    source: str
    target: str
    objects: int = 0
    bytes: int = 0
    checked: int = 0
    mismatched: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _digest(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def copy_shared_state(source: SharedStore, target: SharedStore) -> CopyReport:
    """Copy every object of shared state from ``source`` to ``target``, then read each back
    from ``target`` and compare digests; a mismatch is a :class:`ConsistencyError` naming it."""
    report = CopyReport(source.url, target.url)
    digests = {}
    for key in shared_keys(source):
        data = source.read_bytes(key)
        if data is None:  # removed since it was listed
            continue
        target.write_bytes(key, data)
        digests[key] = _digest(data)
        report.objects += 1
        report.bytes += len(data)
    for key, digest in digests.items():
        if _digest(target.read_bytes(key)) != digest:
            report.mismatched.append(key)
        report.checked += 1
    if report.mismatched:
        raise ConsistencyError(
            f"{len(report.mismatched)} objects differ after the copy: "
            + ", ".join(report.mismatched[:5])
        )
    return report
