"""Ingesting one large file as chunks spread over workers (the pure part of the Celery tasks).

Everything is keyed by the file's *identity* — device, inode, size, modification time and a
hash of its first bytes — and by each chunk's byte range. A chunk's results are Parquet parts
plus a JSON meta file under ``<data_dir>/ingest/<identity>/``, written atomically; a chunk
whose meta file exists is not parsed again, so a redelivered chunk changes nothing. The file
is assembled from its parts into ``<out_dir>`` once every chunk is done.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from pipeline.ingest import IngestOptions, metrics_result, write_windows
from pipeline.ingest.chunk import chunk_from_meta, chunk_meta
from pipeline.ingest.detect import detect
from pipeline.ingest.parse import ChunkSpec, plan_chunks
from pipeline.ingest.run import ChunkJob, FileAssembly, FilePlan, run_chunk
from pipeline.ingest.sinks import ParquetSink, with_pandas_dtypes
from pipeline.ingest.state import identify


def file_identity(path: str | Path) -> str:
    """A name for this file *as it is now*: changes when it grows, is replaced or rewritten."""
    state = identify(path)
    text = f"{state.device}:{state.inode}:{state.size}:{state.mtime}:{state.head_hash}"
    return hashlib.blake2b(text.encode(), digest_size=10).hexdigest()


def part_dir(data_dir: str | Path, identity: str) -> Path:
    """Folder of one file identity's parts."""
    return Path(data_dir) / "ingest" / identity


def plan_file_chunks(
    path: str | Path, options: IngestOptions
) -> tuple[str, str | None, list[dict[str, Any]]]:
    """Identity, format and chunk specs (as dicts, for task messages) of one file."""
    path = Path(path)
    fmt, line_prefix = detect(path, options.format, options.source)
    if fmt is None:
        return file_identity(path), None, []
    specs = plan_chunks(path, fmt, options.chunk_bytes, line_prefix=line_prefix)
    return file_identity(path), fmt, [asdict(s) for s in specs]


def _prefix(folder: Path, spec: ChunkSpec) -> Path:
    return folder / f"{spec.start}-{spec.end if spec.end is not None else 'eof'}"


def ingest_chunk(
    spec: dict[str, Any], options: IngestOptions, folder: str | Path
) -> dict[str, Any]:
    """Parse one chunk into parts under ``folder`` unless already done; return its counters."""
    chunk = ChunkSpec(**spec)
    prefix = _prefix(Path(folder), chunk)
    meta_path = prefix.with_suffix(".meta.json")
    if meta_path.exists():
        pieces = json.loads(meta_path.read_text())["pieces"]
        return {
            "cached": True,
            "lines": sum(p["lines"] for p in pieces),
            "rejected": sum(sum(p["rejects"]["counts"].values()) for p in pieces),
        }
    Path(folder).mkdir(parents=True, exist_ok=True)
    results = run_chunk(ChunkJob(chunk, options, True, str(prefix)))
    tmp = meta_path.with_name(meta_path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pieces": [chunk_meta(r) for r in results]}))
    os.replace(tmp, meta_path)  # the meta file last: its presence means the parts are whole
    return {
        "cached": False,
        "lines": sum(r.lines for r in results),
        "rejected": sum(r.rejects.total for r in results),
    }


def assemble_file(
    path: str | Path,
    fmt: str,
    specs: list[dict[str, Any]],
    options: IngestOptions,
    folder: str | Path,
    out_dir: str | Path,
) -> dict[str, Any]:
    """Assemble every chunk's parts into ``out_dir`` (records, windows, metrics Parquet)."""
    chunks = [ChunkSpec(**s) for s in specs]
    plan = FilePlan(Path(path), fmt, identify(path), "whole file", chunks)
    assembly = FileAssembly(plan, options)
    for chunk in chunks:
        meta = json.loads(_prefix(Path(folder), chunk).with_suffix(".meta.json").read_text())
        assembly.chunks.extend(chunk_from_meta(m) for m in meta["pieces"])
    out = Path(out_dir)
    sink = ParquetSink(options.window, out)
    try:
        summary = assembly.finish(sink)
    finally:
        sink.close()
    metrics_result(sink.metrics).to_parquet(out / "metrics.parquet", index=False)
    counts = sink.summed_counts()
    pq.write_table(with_pandas_dtypes(counts), out / "counts.parquet")
    write_windows(counts, out / "windows.parquet", options)
    return {**summary.to_dict(), "out": str(out), "chunks": len(chunks)}
