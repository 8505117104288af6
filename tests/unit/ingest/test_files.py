"""Files as they really are: chunks, rotation, .gz, incremental runs, bad bytes, huge lines."""

from __future__ import annotations

import dataclasses
import gc
import gzip
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import BadInputError
from pipeline.ingest import IngestOptions, IngestState, ingest_paths
from pipeline.ingest.inputs import UTF16
from pipeline.ingest.lines import BOM, LineReader, binary_lines
from pipeline.ingest.parse import ChunkSpec, parse_pieces, plan_chunks
from pipeline.ingest.summary import Rejects
from tests.conftest import SHARED_DATA

EXAMPLES = SHARED_DATA / "logs" / "examples"
V011 = EXAMPLES / "vllm-v0.11.txt"
TGI_DEBUG = EXAMPLES / "tgi-text-v3-debug.txt"


def _lines(path: Path, **kw) -> tuple[list[str], LineReader, Rejects]:
    rejects = Rejects(str(path))
    reader = LineReader(path, rejects, **kw)
    out = [line for _, block in reader for line in block]
    return out, reader, rejects


def test_reader_skips_a_huge_line_in_bounded_memory(tmp_path):
    path = tmp_path / "huge.log"
    with open(path, "wb") as out:
        out.write(b"first\n")
        out.write(b"x" * (3 << 20) + b"\n")  # 3 MiB against a 64 KiB cap
        out.write(b"last\n")
    lines, reader, rejects = _lines(path, max_line_bytes=64 << 10)
    assert lines == ["first", "last"]
    assert rejects.counts["line too long"] == 1
    assert rejects.samples["line too long"][0][0] == 2  # line number of the giant
    assert reader.lines == 3


def test_reader_invalid_utf8_is_replaced_and_counted(tmp_path):
    path = tmp_path / "bad.log"
    path.write_bytes(b"ok \xc3\xa9\nbad \xff\xfe here\n\x00\x01\x02binary\n")
    lines, reader, _ = _lines(path)
    assert lines[0] == "ok é" and "\ufffd" in lines[1] and len(lines) == 3
    assert reader.repaired == 1


def test_incremental_reader_leaves_a_half_written_line(tmp_path):
    path = tmp_path / "growing.log"
    path.write_bytes(b"one\ntwo\nthr")
    lines, reader, _ = _lines(path, partial_tail=False)
    assert lines == ["one", "two"] and reader.offset == 8
    lines, _, _ = _lines(path, partial_tail=True)
    assert lines[-1] == "thr"


def test_chunks_cut_at_line_and_event_starts(tmp_path):
    path = tmp_path / "tgi.txt"
    path.write_bytes(TGI_DEBUG.read_bytes() * 400)
    chunks = plan_chunks(path, "tgi-text", 1 << 16)
    assert len(chunks) > 5
    data = path.read_bytes()
    for chunk in chunks[1:]:
        assert data[chunk.start : chunk.start + 4] == b"2025"  # an event, not a continuation


def test_a_cut_past_a_long_line_starts_at_the_next_record(tmp_path):
    """A planned cut inside a line longer than the first look past it (64 KiB) still finds
    the next line start, as the whole scan does; no cut falls inside the long line."""
    lines = V011.read_text().splitlines()
    received = next(line for line in lines if "Received request" in line)
    long_line = received.replace("prompt: '", "prompt: '" + "word " * 40_000, 1)  # ~200 KB
    path = tmp_path / "vllm.txt"
    path.write_text("\n".join([*lines, long_line, *lines, long_line, *lines]) + "\n")
    data = path.read_bytes()
    chunks = plan_chunks(path, "vllm", 1 << 16)
    starts = [chunk.start for chunk in chunks]
    assert len(starts) >= 3 and starts == sorted(set(starts))
    assert all(data[start - 1 : start] == b"\n" for start in starts[1:])
    long_spans = [(m, m + len(long_line)) for m in _finds(data, long_line.encode())]
    assert not any(a < start < b for start in starts for a, b in long_spans)
    # the cut planned inside the first long line goes to the line after it
    first_end = long_spans[0][1] + 1
    assert first_end in starts


def _finds(data: bytes, needle: bytes) -> list[int]:
    found, at = [], data.find(needle)
    while at >= 0:
        found.append(at)
        at = data.find(needle, at + 1)
    return found


def test_chunked_run_equals_single_run_for_vllm_and_tgi(tmp_path):
    for source, fmt in ((V011, "vllm"), (TGI_DEBUG, "tgi-text")):
        path = tmp_path / source.name
        path.write_bytes(source.read_bytes() * 150)
        whole = ingest_paths([path], IngestOptions(year=2025))
        chunked = ingest_paths([path], IngestOptions(year=2025, chunk_bytes=1 << 16, workers=2))
        assert len(chunked.records) == len(whole.records) >= 150
        columns = ["ts", "request_id", "status", "output_tokens", "prompt"]
        assert chunked.records[columns].equals(whole.records[columns]), fmt
        assert chunked.summary[0].rejects.total == 0
        assert chunked.summary[0].lines == whole.summary[0].lines


def test_join_across_a_chunk_boundary(tmp_path):
    """Received in one chunk, Aborted in the next: one record, status aborted."""
    lines = V011.read_text().splitlines()
    received = next(x for x in lines if "Received request chatcmpl-e2c4" in x)
    aborted = next(x for x in lines if "Aborted request(s)" in x)
    filler = next(x for x in lines if "Engine 000" in x)
    path = tmp_path / "split.log"
    path.write_text("\n".join([received] + [filler] * 1500 + [aborted]) + "\n")
    result = ingest_paths([path], IngestOptions(year=2025, chunk_bytes=1 << 16))
    records = result.records
    assert len(records) == 1 and records["status"].iloc[0] == "aborted"
    assert len(result.metrics) == 1500


def test_gz_and_truncated_gz_keep_good_records(tmp_path):
    packed = gzip.compress(V011.read_bytes() * 50)
    good = tmp_path / "app.log.1.gz"
    good.write_bytes(packed)
    result = ingest_paths([good], IngestOptions(year=2025))
    assert result.summary[0].format == "vllm" and len(result.records) == 250
    broken = tmp_path / "app.log.2.gz"
    broken.write_bytes(packed[: len(packed) // 2])
    result = ingest_paths([broken], IngestOptions(year=2025))
    summary = result.summary[0]
    assert summary.rejects.counts["truncated or corrupt gzip"] == 1
    assert 0 < len(result.records) < 250


def test_empty_binary_and_unknown_files_never_crash(tmp_path):
    (tmp_path / "empty.log").write_bytes(b"")
    (tmp_path / "junk.bin").write_bytes(os.urandom(5000))
    (tmp_path / "prose.txt").write_text("hello\nworld\n")
    shutil.copy(V011, tmp_path / "vllm.log")
    result = ingest_paths([tmp_path], IngestOptions(year=2025))
    by_name = {Path(s.path).name: s for s in result.summary}
    assert by_name["empty.log"].format == "empty"
    assert by_name["prose.txt"].format == "unknown"
    assert by_name["prose.txt"].rejects.counts["format not recognised"] == 2
    assert by_name["vllm.log"].records == 5
    assert len(result.records) == 5


def test_garbage_inside_a_vllm_log_is_counted_by_reason(tmp_path):
    text = V011.read_bytes()
    path = tmp_path / "mixed.log"
    path.write_bytes(text + b"\xff\xfe\x00garbage\n" + b"random words here\n" + text)
    result = ingest_paths([path], IngestOptions(year=2025))
    summary = result.summary[0]
    assert len(result.records) == 10
    assert summary.rejects.counts == {"invalid utf-8": 1, "not a vLLM log line": 1}
    samples = summary.rejects.sample_lines()["not a vLLM log line"]
    assert samples[0].startswith(f"{path}:24: random words")


def test_incremental_state_reads_only_new_lines_and_handles_rotation(tmp_path):
    lines = V011.read_text().splitlines(keepends=True)
    log, state_file = tmp_path / "app.log", tmp_path / "state.json"
    options = IngestOptions(year=2025)
    log.write_text("".join(lines[:8]) + lines[8].rstrip("\n"))  # a half-written 9th line

    def run() -> int:
        state = IngestState.load(state_file)
        result = ingest_paths([tmp_path / "app.log"], options, state)
        state.save(state_file)
        return len(result.records)

    first = run()
    with open(log, "a") as out:
        out.write("\n" + "".join(lines[9:]))
    second = run()
    assert first + second == 5  # nothing twice, nothing lost
    assert run() == 0  # no growth, nothing read
    os.rename(log, tmp_path / "app.log.1")  # rotation: a new file under the old name
    log.write_text("".join(lines))
    assert run() == 5
    state = IngestState.load(state_file)
    assert state.files[str(log)].offset == log.stat().st_size


def test_rotated_then_compressed_file_is_not_read_twice(tmp_path):
    text = V011.read_text()
    log, state_file = tmp_path / "app.log", tmp_path / "state.json"
    log.write_text(text)
    state = IngestState()
    assert len(ingest_paths([log], IngestOptions(year=2025), state).records) == 5
    state.save(state_file)
    rotated = tmp_path / "app.log.1.gz"
    rotated.write_bytes(gzip.compress((text + text).encode()))
    log.unlink()
    state = IngestState.load(state_file)
    result = ingest_paths([rotated], IngestOptions(year=2025), state)
    assert len(result.records) == 5  # only the part written after the last run
    assert "continued from" in " ".join(result.summary[0].assumptions)


def test_bad_options_are_bad_input():
    with pytest.raises(BadInputError):
        ingest_paths([V011], IngestOptions(format="nope"))
    with pytest.raises(BadInputError):
        ingest_paths([V011], IngestOptions(tz="Mars/Olympus"))
    with pytest.raises(BadInputError):
        IngestOptions(block_size=0)
    with pytest.raises(BadInputError):
        ingest_paths(["/no/such/file.log"])


def test_chunk_meta_round_trips_through_json(tmp_path):
    import json

    from pipeline.ingest.chunk import chunk_from_meta, chunk_meta
    from pipeline.ingest.parse import ChunkSpec, parse_chunk

    result = parse_chunk(ChunkSpec(str(V011), "vllm", 0, None), IngestOptions())
    back = chunk_from_meta(json.loads(json.dumps(chunk_meta(result))))
    assert back.ignored == result.ignored and back.tails == result.tails
    assert back.rejects.counts == result.rejects.counts and back.lines == result.lines


def test_a_50_mb_line_is_skipped_in_bounded_memory_and_nothing_else_is_lost(tmp_path):
    import tracemalloc

    path = tmp_path / "giant.log"
    good = V011.read_bytes()
    with open(path, "wb") as out:
        out.write(good)
        out.write(b"INFO 10-03 16:20:30 [logger.py:40] Received request x: prompt: '")
        chunk = b"y" * (1 << 20)
        for _ in range(50):
            out.write(chunk)
        out.write(b"'\n")
        out.write(good)
    tracemalloc.start()
    rejects = Rejects(str(path))
    reader = LineReader(path, rejects)  # default cap: 8 MiB
    kept = sum(len(block) for _, block in reader)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 40 << 20  # a cap plus a read block or two, never the 50 MB line
    assert rejects.counts["line too long"] == 1 and kept == 44
    result = ingest_paths([path], IngestOptions(year=2025))
    assert len(result.records) == 10
    assert result.summary[0].rejects.counts == {"line too long": 1}


def test_pieces_finished_where_parsed_equal_those_finished_with_their_file(tmp_path, monkeypatch):
    """A format whose pieces stand alone (TGI text) is finished in the parsing processes:
    every output and the summary are those of finishing the pieces with their file."""
    import dataclasses
    import json

    import pandas as pd

    from benchmarks.loggen import tgi_lines, write_log
    from pipeline.ingest import formats, ingest_to_dir

    path = tmp_path / "tgi.log"
    write_log(path, tgi_lines(seed=3), 2 << 20)
    with open(path, "ab") as out:
        out.write(TGI_DEBUG.read_bytes() * 20)
    options = IngestOptions(chunk_bytes=1 << 18, workers=2)
    alone = ingest_to_dir([path], tmp_path / "alone", options)
    tgi = formats.get("tgi-text")
    assert tgi.pieces_stand_alone
    registry = formats._registry().formats
    monkeypatch.setitem(registry, "tgi-text", dataclasses.replace(tgi, pieces_stand_alone=False))
    with_file = ingest_to_dir([path], tmp_path / "with_file", options)
    for summary in (alone, with_file):
        summary.pop("out")
    assert json.dumps(alone, sort_keys=True) == json.dumps(with_file, sort_keys=True)
    assert alone["records"] > 3_000 and alone["files"][0]["rejected"] == {}
    for name in ("records", "counts", "windows", "metrics"):
        got = pd.read_parquet(tmp_path / "alone" / f"{name}.parquet")
        want = pd.read_parquet(tmp_path / "with_file" / f"{name}.parquet")
        pd.testing.assert_frame_equal(got, want, obj=name)


def test_a_parse_pauses_the_cycle_collector_and_restores_it():
    assert gc.isenabled()
    pieces = parse_pieces(ChunkSpec(str(V011), "vllm", 0, None), IngestOptions())
    first = next(pieces)
    assert not gc.isenabled() and first.heads  # paused while the chunk is parsed
    assert list(pieces) == []
    assert gc.isenabled()
    gc.disable()  # a caller's own choice is kept
    try:
        list(parse_pieces(ChunkSpec(str(V011), "vllm", 0, None), IngestOptions()))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_byte_order_mark_is_dropped_at_the_start_only_and_offsets_count_it(tmp_path):
    path = tmp_path / "bom.log"
    path.write_bytes(BOM + b"one\n" + BOM + b"two\nthr")
    lines, reader, _ = _lines(path, partial_tail=False)
    assert lines == ["one", "\ufefftwo"]  # inside the file it is the line's own character
    assert reader.offset == len(BOM) + 4 + len(BOM) + 4  # the file's own offsets
    lines, _, _ = _lines(path, start=reader.offset)  # resuming: the start is no file start
    assert lines == ["thr"]
    path.write_bytes(BOM[:2])  # a file of a BOM's first bytes only: a line of them
    lines, reader, _ = _lines(path)
    assert len(lines) == 1 and reader.offset == 2


def test_incremental_runs_of_a_file_with_a_byte_order_mark_read_each_line_once(tmp_path):
    lines = V011.read_text().splitlines(keepends=True)
    log, state_file = tmp_path / "app.log", tmp_path / "state.json"
    log.write_bytes(BOM + "".join(lines[:8]).encode())

    def run() -> int:
        state = IngestState.load(state_file)
        result = ingest_paths([log], IngestOptions(year=2025), state)
        state.save(state_file)
        return len(result.records)

    first = run()
    with open(log, "a") as out:
        out.write("".join(lines[8:]))
    assert first + run() == 5 and run() == 0
    assert IngestState.load(state_file).files[str(log)].offset == log.stat().st_size


def test_a_utf16_file_says_so_in_its_rejects(tmp_path):
    """Windows PowerShell's ``>`` writes UTF-16: every line is rejected for that reason,
    which tells how to convert the file, not as an unknown format."""
    path = tmp_path / "vllm.log"
    path.write_bytes(V011.read_text().encode("utf-16"))
    summary = ingest_paths([path], IngestOptions(year=2025)).summary[0]
    assert summary.format == "unknown" and summary.records == 0
    assert set(summary.rejects.counts) == {UTF16} and "iconv" in UTF16
    assert summary.rejects.total == summary.lines > 0


def test_pieces_finished_in_worker_processes_equal_those_finished_here(tmp_path):
    """A vLLM log's pieces finished by worker processes (records and counts handed over in
    scratch files) write the same folder as pieces finished in this process."""
    import pyarrow.parquet as pq

    from benchmarks.loggen import vllm_lines, write_log
    from pipeline.ingest import ingest_to_dir

    path = tmp_path / "vllm.log"
    write_log(path, vllm_lines(seed=5), 2 << 20)
    pooled = IngestOptions(year=2025, chunk_bytes=1 << 18, workers=2)
    here = dataclasses.replace(pooled, workers=1)
    by_workers = ingest_to_dir([path], tmp_path / "workers", pooled)
    by_one = ingest_to_dir([path], tmp_path / "one", here)
    for summary in (by_workers, by_one):
        summary.pop("out")
    assert by_workers == by_one and by_workers["records"] > 500
    for name in ("records", "counts", "windows", "metrics"):
        got = pq.read_table(tmp_path / "workers" / f"{name}.parquet")
        assert got.equals(pq.read_table(tmp_path / "one" / f"{name}.parquet")), name


def test_a_distributed_assembly_keeps_its_parts_for_a_task_run_again(tmp_path):
    """A distributed ingest's parts are a cache: assembling twice gives the same records."""
    import pyarrow.parquet as pq

    from benchmarks.loggen import vllm_lines, write_log
    from pipeline.ingest.distributed import assemble_file, ingest_chunk, plan_file_chunks

    path = tmp_path / "vllm.log"
    write_log(path, vllm_lines(seed=6), 1 << 20)
    options = IngestOptions(year=2025, chunk_bytes=1 << 18)
    _, fmt, specs = plan_file_chunks(path, options)
    assert fmt == "vllm" and len(specs) > 1
    for spec in specs:
        ingest_chunk(spec, options, tmp_path / "parts")
    first = assemble_file(path, fmt, specs, options, tmp_path / "parts", tmp_path / "a")
    again = assemble_file(path, fmt, specs, options, tmp_path / "parts", tmp_path / "b")
    assert first["records"] == again["records"] > 100
    records = [pq.read_table(tmp_path / out / "records.parquet") for out in ("a", "b")]
    assert records[0].equals(records[1])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40), max_size=60),
    st.integers(16, 200),
)
def test_a_blocks_binary_lines_are_its_lines_with_their_newlines(tmp_path_factory, lines, size):
    """The bytes a column-wise reader gets of a block (viewed in place where the block decoded
    whole, built otherwise) are each line's UTF-8 with one newline after it."""
    texts = [line.replace("\n", " ").replace("\r", " ") for line in lines]
    path = tmp_path_factory.mktemp("binary") / "x.log"
    path.write_bytes("".join(f"{text}\n" for text in texts).encode())
    seen = []
    for _, block in LineReader(path, Rejects(str(path)), block_bytes=size):
        assert binary_lines(block).to_pylist() == [f"{line}\n".encode() for line in block]
        seen.extend(block)
    assert seen == texts
