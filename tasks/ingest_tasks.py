"""Ingest tasks: a large log file fans out as byte-range chunks across workers.

``prewarm.ingest.file(path, out_dir=None, options=None, data_dir=None)`` plans the chunks and
sends them as a chord: ``prewarm.ingest.chunk`` per byte range (parts under
``<data_dir>/ingest/<file identity>/``), then ``prewarm.ingest.assemble`` writes
``records.parquet``, ``windows.parquet`` and ``metrics.parquet`` into ``out_dir`` (default
``<data_dir>/ingest/<identity>/out``). It returns the identity, the chunk count and the id of
the assembly result. ``options`` are :class:`pipeline.ingest.IngestOptions` fields (JSON).

Every task is idempotent: a chunk whose parts exist for this file identity and byte range is
not parsed again; assembling twice writes the same files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import chord, shared_task

from pipeline.ingest import IngestOptions
from pipeline.ingest.distributed import assemble_file, ingest_chunk, part_dir, plan_file_chunks
from tasks.base import PrewarmTask
from tasks.settings import current_settings


def _options(options: dict[str, Any] | None) -> IngestOptions:
    return IngestOptions(**(options or {}))


def _data_dir(data_dir: str | None) -> Path:
    # a chunked ingest's parts are a host's own work files: a folder given, else the host's
    # folder (a bucket ``data_dir`` holds no parts; see docs/pages/object-storage.md)
    return Path(data_dir) if data_dir else current_settings().host_dir


#: An ingest runs as long as its input takes (a large log is minutes per chunk): no time limit.
_UNLIMITED: dict[str, Any] = {"soft_time_limit": None, "time_limit": None}


@shared_task(name="prewarm.ingest.file", base=PrewarmTask, **_UNLIMITED)
def ingest_file(
    path: str,
    out_dir: str | None = None,
    options: dict[str, Any] | None = None,
    data_dir: str | None = None,
) -> dict[str, Any]:
    """Plan ``path``'s chunks and send them, with the assembly as the chord callback."""
    identity, fmt, specs = plan_file_chunks(path, _options(options))
    folder = part_dir(_data_dir(data_dir), identity)
    if fmt is None:
        return {"path": path, "identity": identity, "format": None, "chunks": 0}
    out = out_dir or str(folder / "out")
    header = [ingest_chunk_task.s(spec, options, str(folder)) for spec in specs]
    result = chord(header)(assemble_task.s(path, fmt, specs, options, str(folder), out))
    return {"path": path, "identity": identity, "format": fmt, "chunks": len(specs),
            "out": out, "assemble_id": result.id}  # fmt: skip


@shared_task(name="prewarm.ingest.chunk", base=PrewarmTask, **_UNLIMITED)
def ingest_chunk_task(
    spec: dict[str, Any], options: dict[str, Any] | None, folder: str
) -> dict[str, Any]:
    """Parse one byte range into parts (skipped when they already exist)."""
    return ingest_chunk(spec, _options(options), folder)


@shared_task(name="prewarm.ingest.assemble", base=PrewarmTask, **_UNLIMITED)
def assemble_task(
    chunk_results: list[dict[str, Any]],
    path: str,
    fmt: str,
    specs: list[dict[str, Any]],
    options: dict[str, Any] | None,
    folder: str,
    out_dir: str,
) -> dict[str, Any]:
    """Join the chunks' parts into the output folder; return the file's summary."""
    summary = assemble_file(path, fmt, specs, _options(options), folder, out_dir)
    summary["chunks_cached"] = sum(1 for r in chunk_results if r.get("cached"))
    return summary
