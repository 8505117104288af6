"""A large log fans out as byte-range chunks over a real worker; redelivery changes nothing."""

from __future__ import annotations

import pandas as pd
import pytest
from celery.result import AsyncResult

from pipeline.ingest import IngestOptions, ingest_paths
from pipeline.ingest.distributed import part_dir, plan_file_chunks
from pipeline.ingest.sinks import read_records
from tests.conftest import SHARED_DATA

pytestmark = pytest.mark.integration

V011 = SHARED_DATA / "logs" / "examples" / "vllm-v0.11.txt"
TGI_V3 = SHARED_DATA / "logs" / "examples" / "tgi-text-v3.txt"
OPTIONS = {"year": 2025, "chunk_bytes": 1 << 16}


def _through_worker(app, log, options, tmp_path):
    """``prewarm.ingest.file`` on a real worker: its plan and its assembly's summary."""
    data, out = tmp_path / "data", tmp_path / "out"
    sent = app.send_task(
        "prewarm.ingest.file",
        args=[str(log)],
        kwargs={"out_dir": str(out), "options": options, "data_dir": str(data)},
    )
    plan = sent.get(timeout=60)
    return plan, AsyncResult(plan["assemble_id"], app=app).get(timeout=120)


def test_chunks_fan_out_assemble_and_redelivery_is_harmless(
    celery_worker, celery_app_configured, tmp_path
):
    log = tmp_path / "big.log"
    log.write_bytes(V011.read_bytes() * 120)  # ~750 KB: a dozen 64 KiB chunks
    data, out = tmp_path / "data", tmp_path / "out"
    plan, summary = _through_worker(celery_app_configured, log, OPTIONS, tmp_path)
    assert plan["format"] == "vllm" and plan["chunks"] >= 10
    assert summary["rejected"] == {} and summary["records"] == 600

    records = read_records(out / "records.parquet")
    expected = ingest_paths([log], IngestOptions(year=2025)).records
    columns = ["ts", "request_id", "status", "output_tokens", "prompt", "prefix_hashes"]
    order = columns[:-1]  # the file repeats itself: rows equal on these are equal on all

    def ordered(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[columns].sort_values(order, kind="stable").reset_index(drop=True)

    pd.testing.assert_frame_equal(ordered(records), ordered(expected))
    assert (out / "windows.parquet").exists() and (out / "metrics.parquet").exists()

    identity, _, specs = plan_file_chunks(log, IngestOptions(**OPTIONS))
    assert identity == plan["identity"]
    folder = part_dir(data, identity)
    parts = sorted(folder.glob("*.parquet"))
    before = {p: p.stat().st_mtime_ns for p in parts}
    again = celery_app_configured.send_task(
        "prewarm.ingest.chunk", args=[specs[3], OPTIONS, str(folder)]
    ).get(timeout=60)
    assert again["cached"] is True
    assert {p: p.stat().st_mtime_ns for p in sorted(folder.glob("*.parquet"))} == before


def test_tgi_pieces_finished_by_the_chunk_tasks_assemble_as_ingested_here(
    celery_worker, celery_app_configured, tmp_path
):
    """TGI text pieces stand alone: the chunk tasks finish them, the assembly only writes."""
    log = tmp_path / "tgi.log"
    log.write_bytes(TGI_V3.read_bytes() * 200)  # ~500 KB: several 64 KiB chunks
    data, out = tmp_path / "data", tmp_path / "out"
    plan, summary = _through_worker(celery_app_configured, log, {"chunk_bytes": 1 << 16}, tmp_path)
    assert plan["format"] == "tgi-text" and plan["chunks"] >= 5
    assert summary["rejected"] == {} and summary["records"] == 1800
    records = read_records(out / "records.parquet").sort_values("ts", kind="stable")
    expected = ingest_paths([log], IngestOptions()).records
    pd.testing.assert_frame_equal(records.reset_index(drop=True), expected)
    assert list(part_dir(data, plan["identity"]).glob("*.records.arrow"))  # finished there


def test_a_prefixed_log_through_the_chunk_tasks_reads_as_the_log_itself(
    celery_worker, celery_app_configured, tmp_path
):
    """``docker compose logs`` output: the chunk tasks cut each line's prefix (and the chunks
    at events), the records are those of the log without it."""
    plain = tmp_path / "plain" / "tgi.log"
    plain.parent.mkdir()
    plain.write_bytes(TGI_V3.read_bytes() * 200)
    log = tmp_path / "tgi.log"
    log.write_bytes(b"".join(b"tgi-1  | " + line for line in plain.read_bytes().splitlines(True)))
    plan, summary = _through_worker(celery_app_configured, log, {"chunk_bytes": 1 << 16}, tmp_path)
    assert plan["format"] == "tgi-text" and plan["chunks"] >= 5
    assert summary["rejected"] == {} and summary["records"] == 1800
    records = read_records(tmp_path / "out" / "records.parquet").sort_values("ts", kind="stable")
    expected = ingest_paths([plain], IngestOptions()).records
    pd.testing.assert_frame_equal(records.reset_index(drop=True), expected)
