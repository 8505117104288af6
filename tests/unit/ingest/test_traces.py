"""Trace readers on the real public traces and on broken copies of them."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from pipeline.ingest.summary import Rejects
from pipeline.ingest.traces import (
    TRACE_EPOCH,
    azure_rows,
    jsonl_rows,
    mooncake_rows,
    read_azure,
    read_jsonl,
    read_mooncake,
    read_servegen,
)
from pipeline.prefix import block_hashes, block_hashes_from_ids
from pipeline.records import RECORD_COLUMNS
from tests.conftest import SHARED_DATA

TRACES = SHARED_DATA / "traces"


def test_mooncake_first_rows_and_hashes_as_given():
    records = read_mooncake(TRACES / "conversation_trace.jsonl")
    assert len(records) == 12031
    assert tuple(records.columns) == RECORD_COLUMNS
    first = records.iloc[0]
    assert first["ts"] == TRACE_EPOCH
    assert first["prompt_tokens"] == 6758 and first["output_tokens"] == 500
    assert first["prefix_hashes"] == [str(h) for h in range(14)]
    assert records.iloc[1]["prefix_hashes"][:3] == ["0", "14", "15"]
    assert (records["source"] == "trace").all()
    span = records["ts"].max() - records["ts"].min()
    assert pd.Timedelta(minutes=58) < span < pd.Timedelta(minutes=60)


def test_mooncake_epoch_is_an_option():
    epoch = pd.Timestamp("2025-03-01T12:00:00Z")
    records = read_mooncake(TRACES / "conversation_trace.jsonl", epoch=epoch)
    assert records["ts"].min() == epoch


def test_azure_code_trace_real_timestamps():
    records = read_azure(TRACES / "AzureLLMInferenceTrace_code.csv")
    assert len(records) == 8819
    first = records.iloc[0]
    assert first["ts"] == pd.Timestamp("2023-11-16 18:17:03.979960", tz="UTC")
    assert (first["prompt_tokens"], first["output_tokens"]) == (4808, 10)
    assert records["prefix_hashes"].isna().all()


def test_servegen_counts_shape_and_rate_times_600(tmp_path):
    counts = read_servegen(TRACES / "servegen" / "m-large" / "chunk-0-trace.csv")
    assert list(counts.columns) == [
        "item_kind", "item_key", "window_start", "requests", "prompt_tokens", "output_tokens"
    ]  # fmt: skip
    assert (counts["item_key"] == "client-0").all()
    assert (counts["requests"] > 0).all()
    first = counts.iloc[0]
    assert first["window_start"] == TRACE_EPOCH
    assert first["requests"] == round(1.3316666666666668 * 600)
    assert str(counts["window_start"].dtype) == "datetime64[us, UTC]"


def test_servegen_directory_has_one_tenant_per_file():
    counts = read_servegen(TRACES / "servegen")
    assert counts["item_key"].nunique() == 162
    assert counts["window_start"].max() < TRACE_EPOCH + pd.Timedelta(days=14)


def test_broken_mooncake_lines_are_counted_not_fatal(tmp_path):
    good = (TRACES / "conversation_trace.jsonl").read_text().splitlines()[:5]
    bad = ["{not json", '{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": []}',
           '{"timestamp": 5}', "\x00\x01\x02"]  # fmt: skip
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join([*good[:2], *bad, *good[2:]]) + "\n")
    rejects = Rejects(str(path))
    rows = mooncake_rows(path, rejects)
    assert len(rows) == 5
    assert rejects.total == 4
    assert any(":3:" in s for samples in rejects.sample_lines().values() for s in samples)


def test_truncated_gzip_azure_keeps_the_good_rows(tmp_path):
    data = (TRACES / "AzureLLMInferenceTrace_conv.csv").read_bytes()
    packed = gzip.compress(data)
    path = tmp_path / "azure.csv.gz"
    path.write_bytes(packed[: len(packed) // 2])
    rejects = Rejects(str(path))
    rows = azure_rows(path, rejects)
    assert 1000 < len(rows) < 19366
    assert rejects.counts["truncated or corrupt gzip"] == 1


def test_prewarm_jsonl_hashes_from_prompt_ids_or_given(tmp_path):
    lines = [
        {"ts": "2025-06-03T09:41:17Z", "request_id": "a", "prompt": "one two three four five",
         "tenant": "acme", "prompt_tokens": 5},
        {"ts": 1700000000, "request_id": "b", "token_ids": [1, 2, 3, 4, 5, 6, 7, 8]},
        {"ts": "2025-06-03 09:41:18", "request_id": "c", "prefix_hashes": ["x", "y"]},
        {"request_id": "no-ts"},
        [1, 2],
    ]  # fmt: skip
    path = tmp_path / "req.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    rejects = Rejects(str(path))
    assert len(jsonl_rows(path, rejects, block_size=4)) == 3
    assert rejects.total == 2
    records = read_jsonl(path, block_size=4)
    by_id = records.set_index("request_id")
    assert by_id.loc["a", "prefix_hashes"] == block_hashes("one two three four five", 4)
    assert by_id.loc["b", "prefix_hashes"] == block_hashes_from_ids(list(range(1, 9)), 4)
    assert by_id.loc["c", "prefix_hashes"] == ["x", "y"]
    assert by_id.loc["b", "ts"] == pd.Timestamp(1700000000, unit="s", tz="UTC")
    assert by_id.loc["c", "ts"].tzinfo is not None
    assert by_id.loc["a", "tenant"] == "acme"


@pytest.mark.parametrize("bad", ["true", "1.5", "-3", '"x"'])
def test_counts_must_be_whole_non_negative_numbers(tmp_path, bad):
    path = tmp_path / "mc.jsonl"
    path.write_text(
        f'{{"timestamp": 0, "input_length": {bad}, "output_length": 1, "hash_ids": []}}\n'
    )
    rejects = Rejects(str(path))
    assert mooncake_rows(path, rejects) == []
    assert rejects.total == 1


def test_multi_member_gzip_reads_every_member(tmp_path):
    path = tmp_path / "two.jsonl.gz"
    line = '{"timestamp": 1, "input_length": 2, "output_length": 3, "hash_ids": [7]}\n'
    path.write_bytes(gzip.compress(line.encode() * 3) + gzip.compress(line.encode() * 2))
    rejects = Rejects(str(path))
    assert len(mooncake_rows(path, rejects)) == 5
    assert rejects.total == 0
