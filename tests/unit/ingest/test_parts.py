"""A log piece's parts read back in the finishing step's dtypes, and times resolved alike
whether each row or each distinct time is parsed."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.formats import vllm
from pipeline.ingest.parse import heads_of, heads_table, metrics_of, metrics_table


def test_heads_part_round_trip_keeps_empty_and_missing_chains() -> None:
    heads: list[dict[str, object]] = [
        {"request_id": "a", "prompt": "hi", "prefix_hashes": ["0f", "1e"], "_line": 3},
        {"request_id": "b", "prompt": None, "prefix_hashes": None, "_line": 4},
        {"request_id": "c", "prompt": "", "prefix_hashes": [], "_line": 5},
    ]
    frame = heads_of(heads_table(heads))
    assert frame["prompt"].tolist() == ["hi", pd.NA, ""]
    assert frame["prefix_hashes"].tolist() == [["0f", "1e"], pd.NA, []]
    assert frame["_line"].dtype == np.int64
    assert list(frame.columns) == heads_table([]).column_names


def test_metrics_part_reads_back_in_nullable_dtypes() -> None:
    rows: list[dict[str, object]] = [{"ts": "01-02 03:04:05", "running": 3.0, "_line": 7}, {}]
    frame = metrics_of(metrics_table(rows))
    assert frame["ts"].dtype == "string" and frame["running"].dtype == "Float64"
    assert frame["_line"].tolist() == [7, 0] and frame["_line"].dtype == np.int64
    assert frame["waiting"].isna().all()


TIMES = ["12-31 23:59:59", "02-29 10:00:00", "13-01 00:00:00", None, "03-30 02:30:00",
         "11-02 01:30:00", "01-01 00:00:60", "01-01 24:00:00", "12-31 23:59:59"]  # fmt: skip


@pytest.mark.parametrize("tz", ["UTC", "Europe/Berlin", "America/New_York"])
def test_resolve_vllm_ts_parses_each_distinct_time_as_each_row(
    tz: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = pd.Series(pd.array(TIMES * 4, dtype="string"), name="ts")
    lines = pd.Series(np.arange(len(text)))
    chunk = ChunkResult("x.log", "vllm", 0, 0)
    chunk.rollovers = [9, 27]
    each_row = vllm.resolve_vllm_ts(text, lines, chunk, 2024, tz)
    monkeypatch.setattr(vllm, "_DISTINCT_FROM", 0)
    distinct = vllm.resolve_vllm_ts(text, lines, chunk, 2024, tz)
    pd.testing.assert_series_equal(distinct, each_row)
    assert distinct.iloc[9 + 8] == pd.Timestamp("2025-12-31 23:59:59", tz=tz).tz_convert("UTC")
