"""The check that a changed copy of a log reads as the log itself."""

from __future__ import annotations

import pandas as pd

from pipeline.ingest import IngestResult


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
