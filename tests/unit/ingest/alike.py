"""Every example and spec log, and the check that a changed copy of one reads as the log
itself."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pipeline.ingest import IngestOptions, IngestResult, ingest_paths
from tests.conftest import SHARED_DATA

EXAMPLES = SHARED_DATA / "logs" / "examples"
SPEC_ONLY = Path(__file__).resolve().parents[2] / "data" / "ingest"
#: the example logs of FORMATS.md, then the spec-only variants
FILES = sorted(EXAMPLES.iterdir()) + sorted(SPEC_ONLY.iterdir())


def read_pair(
    folder: Path, name: str, clean: bytes, changed: bytes, options: IngestOptions
) -> tuple[IngestResult, IngestResult]:
    """``changed`` and ``clean`` ingested, each as a file called ``name`` (one name: one
    instance) in its own folder under ``folder``."""
    results = []
    for sub, data in (("changed", changed), ("clean", clean)):
        path = folder / sub / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        results.append(ingest_paths([path], options))
    return results[0], results[1]


def assert_read_alike(dirty: IngestResult, clean: IngestResult, extra_rejects: int = 0) -> None:
    """``dirty`` (one file's ingest) gives ``clean``'s format, records, metrics and ignored
    counts, and ``extra_rejects`` more rejected lines."""
    dirty_summary, clean_summary = dirty.summary[0], clean.summary[0]
    assert dirty_summary.format == clean_summary.format
    pd.testing.assert_frame_equal(dirty.records, clean.records)
    pd.testing.assert_frame_equal(dirty.metrics, clean.metrics, check_dtype=False)
    assert dirty_summary.ignored == clean_summary.ignored
    rejected = dirty_summary.rejects.total - clean_summary.rejects.total
    assert rejected == extra_rejects, dirty_summary.rejects.sample_lines()
