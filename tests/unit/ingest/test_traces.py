"""Trace readers on the real public traces and on broken copies of them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from pipeline.ingest import IngestOptions, ingest_paths
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
from pipeline.prefix_blocks import block_hashes, block_hashes_from_ids
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


#: prewarm JSONL lines each holding one value its record column cannot hold
_UNHELD = {
    "ts past 2262": ('{"ts": "3000-01-01T00:00:00Z", "request_id": "x"}', "ts out of range"),
    "count past 64 bits": (
        f'{{"ts": 1700000000, "request_id": "x", "prompt_tokens": {2**63}}}',
        "prompt_tokens not Int64",
    ),
    "seed past u64": (
        f'{{"ts": 1700000000, "request_id": "x", "seed": {2**64}}}',
        "seed not UInt64",
    ),
    "negative seed": ('{"ts": 1700000000, "request_id": "x", "seed": -1}', "seed not UInt64"),
    "fractional top_k": ('{"ts": 1700000000, "request_id": "x", "top_k": 1.5}', "top_k not Int64"),
    "word as a flag": (
        '{"ts": 1700000000, "request_id": "x", "prompt_truncated": "yes"}',
        "prompt_truncated not boolean",
    ),
}


@pytest.mark.parametrize("case", sorted(_UNHELD))
def test_a_value_its_column_cannot_hold_rejects_its_row_only(tmp_path, case):
    """Such a value stopped the whole file (OutOfBoundsDatetime, OverflowError when the rows
    became columns); now its row is one reject naming the column, its neighbours as without it."""
    line, reason = _UNHELD[case]
    good = [
        json.dumps({"ts": "2025-06-03T09:41:17Z", "request_id": "a", "prompt_tokens": 5,
                    "seed": 2**64 - 1, "top_k": 40, "prompt_truncated": False}),
        json.dumps({"ts": 1700000000.5, "request_id": "b", "temperature": 0.7}),
    ]  # fmt: skip
    clean, dirty = tmp_path / "clean" / "req.jsonl", tmp_path / "dirty" / "req.jsonl"
    for path, lines in ((clean, good), (dirty, [good[0], line, good[1]])):
        path.parent.mkdir()
        path.write_text("\n".join(lines) + "\n")
    kept, alone = ingest_paths([dirty]), ingest_paths([clean])
    pd.testing.assert_frame_equal(kept.records, alone.records)
    rejects = kept.summary[0].rejects
    assert dict(rejects.counts) == {f"bad row: {reason}": 1}
    assert rejects.sample_lines()[f"bad row: {reason}"] == [f"{dirty}:2: {line}"]
    assert kept.records.set_index("request_id").loc["a", "seed"] == 2**64 - 1  # (exactly)


def test_trace_times_and_counts_past_their_range_reject_their_rows(tmp_path):
    mooncake = tmp_path / "mc.jsonl"
    row = '{{"timestamp": {}, "input_length": {}, "output_length": 1, "hash_ids": [1]}}'
    years_400 = 400 * 365 * 86400 * 1000  # ms: past 2262 from the 2024 epoch
    mooncake.write_text("\n".join([row.format(0, 5), row.format(years_400, 5),
                                   row.format(1, 2**63), row.format(2, 6)]) + "\n")  # fmt: skip
    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4,5\n"
                     f"3000-01-01 00:00:00,4,5\n2023-11-16 18:17:04.0,{2**64},5\n"
                     "2023-11-16 18:17:05.0,6,7\n")  # fmt: skip
    servegen = tmp_path / "chunk-7-trace.csv"
    servegen.write_text("0,1.5,1,Gamma,1,1\n600,1e300,1,Gamma,1,1\n1200,0.5,1,Gamma,1,1\n")
    result = ingest_paths([mooncake, azure, servegen])
    by_file = {Path(s.path).name: s for s in result.summary}
    assert dict(by_file["mc.jsonl"].rejects.counts) == {
        "bad row: ts out of range": 1, "bad row: prompt_tokens not Int64": 1
    }  # fmt: skip
    assert dict(by_file["azure.csv"].rejects.counts) == {
        "bad row: ts out of range": 1, "bad row: prompt_tokens not Int64": 1
    }  # fmt: skip
    assert dict(by_file["chunk-7-trace.csv"].rejects.counts) == {"bad row: requests not int64": 1}
    assert (by_file["mc.jsonl"].records, by_file["azure.csv"].records) == (2, 2)
    tenant = result.counts[result.counts["item_key"] == "client-7"]
    assert tenant["requests"].tolist() == [900, 300]


def test_servegen_is_known_by_its_file_name_compressed_too(tmp_path):
    """A client's rows under another name are no ServeGen file (the name is the client's only
    id: reading one stopped the ingest with a ValueError), a compressed one is."""
    source = TRACES / "servegen" / "m-large" / "chunk-0-trace.csv"
    packed = tmp_path / "chunk-0-trace.csv.gz"
    packed.write_bytes(gzip.compress(source.read_bytes()))
    renamed = tmp_path / "client.csv"
    renamed.write_bytes(source.read_bytes())
    result = ingest_paths([packed, renamed])
    formats = {Path(s.path).name: s.format for s in result.summary}
    assert formats == {"chunk-0-trace.csv.gz": "servegen", "client.csv": "unknown"}
    expected = read_servegen(source)
    assert len(result.counts) == len(expected)
    assert result.counts["requests"].sum() == expected["requests"].sum()
    forced = ingest_paths([renamed], IngestOptions(format="servegen")).summary[0]
    lines = len(source.read_text().splitlines())
    reason = "ServeGen row of a file not named chunk-<n>-trace.csv"
    assert dict(forced.rejects.counts) == {reason: lines}
