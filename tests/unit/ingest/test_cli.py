"""``prewarm ingest`` end to end, in-process: files written, summary printed, state kept."""

from __future__ import annotations

import json
import shutil

import pandas as pd

from jobs.cli import main
from pipeline.ingest.sinks import read_records
from pipeline.records import RECORD_COLUMNS
from tests.conftest import SHARED_DATA

EXAMPLES = SHARED_DATA / "logs" / "examples"


def test_ingest_command_writes_parquet_and_json_summary(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("vllm-v0.11.txt", "tgi-json-v3.jsonl"):
        shutil.copy(EXAMPLES / name, logs / name)
    out = tmp_path / "out"
    main(["ingest", str(logs), "--out", str(out), "--json", "--year", "2025", "--workers", "1"])
    summary = json.loads(capsys.readouterr().out)
    by_format = {f["format"]: f for f in summary["files"]}
    assert by_format["vllm"]["records"] == 5 and by_format["tgi-json"]["records"] == 9
    assert all(f["rejected"] == {} for f in summary["files"])
    records = read_records(out / "records.parquet")
    assert tuple(records.columns) == RECORD_COLUMNS and len(records) == 14
    assert isinstance(records.dropna(subset=["prompt"])["prefix_hashes"].iloc[0], list)
    assert len(pd.read_parquet(out / "metrics.parquet")) == 1
    counts = pd.read_parquet(out / "counts.parquet")
    assert str(counts["item_key"].dtype) == "string"  # the counts shape's dtypes survive
    assert set(counts["item_kind"]) >= {"prefix", "prompt", "adapter"}
    windows = pd.read_parquet(out / "windows.parquet")
    keys = ["item_kind", "item_key", "window_start", "requests"]
    seen = windows.loc[windows["requests"] > 0, keys].sort_values(keys, ignore_index=True)
    pd.testing.assert_frame_equal(seen, counts[keys].sort_values(keys, ignore_index=True))
    frequent = windows[windows["lag_1"].notna()]
    assert len(frequent) and (frequent.groupby("item_key")["requests"].sum() >= 2).all()


def test_ingest_command_state_reads_only_new_lines(tmp_path, capsys):
    log, state = tmp_path / "app.log", tmp_path / "state.json"
    lines = (EXAMPLES / "vllm-v0.4.txt").read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:6]))
    args = ["ingest", str(log), "--out", str(tmp_path / "out"), "--json", "--state", str(state)]
    main([*args, "--workers", "1"])
    first = json.loads(capsys.readouterr().out)["records"]
    with open(log, "a") as handle:
        handle.write("".join(lines[6:]))
    main([*args, "--workers", "1"])
    second = json.loads(capsys.readouterr().out)["records"]
    assert first + second == 4 and second > 0
