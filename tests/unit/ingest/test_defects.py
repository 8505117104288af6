"""One test per class of defect found by ingesting unseen real-format logs (issue 14), and a
FIFO named on the command line (issue 16): each would have failed before its fix."""

from __future__ import annotations

import gzip
import json
import os
import re
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.cli import main
from pipeline.errors import BadInputError
from pipeline.ingest import IngestOptions, ingest_paths, ingest_to_dir
from pipeline.ingest.parse import ChunkSpec, parse_pieces
from pipeline.ingest.sinks import read_records
from pipeline.prefix_blocks import count_tokens
from tests.conftest import SHARED_DATA

EXAMPLES = SHARED_DATA / "logs" / "examples"
SPEC_ONLY = Path(__file__).resolve().parents[2] / "data" / "ingest"
SOME = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- 1. truncation is never guessed ---------------------------------------------------------

V06_RECEIVED = (
    "INFO 09-25 15:00:{s:02d} logger.py:36] Received request cmpl-{i:032x}-0: prompt: {p!r}, "
    "params: SamplingParams(n=1, best_of=1, presence_penalty=0.0, frequency_penalty=0.0, "
    "repetition_penalty=1.0, temperature=0.7, top_p=1.0, top_k=-1, min_p=0.0, seed=None, "
    "use_beam_search=False, length_penalty=1.0, early_stopping=False, stop=[], "
    "stop_token_ids=[], include_stop_str_in_output=False, ignore_eos=False, max_tokens=16, "
    "min_tokens=0, logprobs=None, prompt_logprobs=None, skip_special_tokens=True, "
    "spaces_between_special_tokens=True, truncate_prompt_tokens=None), prompt_token_ids: "
    "{ids}, lora_request: None, prompt_adapter_request: None."
)
WORDS = st.sampled_from(["Hi", "the", "cache", "warm", "?", "San", "Francisco", "is", "a", "é"])


@st.composite
def whole_prompts(draw: st.DrawFn) -> tuple[str, int]:
    """A prompt printed whole, with a token count a real tokenizer could give it (about one
    per pseudo-token, a few special tokens) — and as often as possible one equal to its
    number of characters, the coincidence the old detector took for a cut."""
    prompt = " ".join(draw(st.lists(WORDS, min_size=1, max_size=12)))
    low = count_tokens(prompt)
    high = int(1.5 * (low + sum(1 for c in prompt if ord(c) > 127))) + 3
    ids = len(prompt) if low <= len(prompt) <= high and draw(st.booleans()) else None
    return prompt, ids if ids is not None else draw(st.integers(low, high))


def _v06_log(tmp_path: Path, prompts: list[tuple[str, int]]) -> Path:
    lines = [
        V06_RECEIVED.format(s=i % 60, i=i, p=p, ids=list(range(100, 100 + n)))
        for i, (p, n) in enumerate(prompts)
    ]
    path = tmp_path / "vllm-no-cap.log"
    path.write_text("\n".join(lines) + "\n")
    return path


@SOME
@given(st.lists(whole_prompts(), min_size=1, max_size=8))
def test_a_log_without_max_log_len_never_assumes_one(tmp_path_factory, prompts):
    path = _v06_log(tmp_path_factory.mktemp("cap"), prompts)
    result = ingest_paths([path], IngestOptions(year=2024))
    assert not any("max-log-len" in a for a in result.summary[0].assumptions)
    records = result.records
    assert not records["prompt_truncated"].any()
    assert records["prompt_tokens"].tolist() == [n for _, n in prompts]


def test_the_old_guess_from_one_short_prompt_is_gone(tmp_path):
    """'Hi' with two ids (BOS) and longer prompts: the old detector assumed --max-log-len 2."""
    path = _v06_log(tmp_path, [("Hi", 2), ("San Francisco is a", 5), ("Hi", 2)])
    result = ingest_paths([path], IngestOptions(year=2024))
    assert result.records["prompt_tokens"].tolist() == [2, 5, 2]
    assert not result.records["prompt_truncated"].any()


def test_a_real_cap_is_still_detected_and_a_given_one_used(tmp_path):
    text = "<s>[INST] What's the weather like in Paris this weekend? [/INST]"
    path = _v06_log(tmp_path, [(text[:40], 40), ("short one", 3)])
    result = ingest_paths([path], IngestOptions(year=2024))
    assert result.records["prompt_truncated"].tolist() == [True, False]
    assert any("--max-log-len 40" in a for a in result.summary[0].assumptions)
    given = ingest_paths([path], IngestOptions(year=2024, max_log_len=9))
    assert given.records["prompt_truncated"].tolist() == [True, True]


# --- 3. seeds -------------------------------------------------------------------------------

TGI_V3 = (EXAMPLES / "tgi-text-v3.txt").read_text().splitlines()
TGI_SEEDED = next(line for line in TGI_V3 if 'seed="Some(' in line)


@SOME
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=6))
def test_u64_seeds_round_trip_exactly(tmp_path_factory, seeds):
    """Several seeds a file (pandas reads a list mixing values below and above 2**63 through
    float64), on both the column-wise path and the per-line one (no ``total_time``)."""
    folder = tmp_path_factory.mktemp("seed")
    path = folder / "tgi.log"
    lines = [re.sub(r'seed="Some\(\d+\)"', f'seed="Some({seed})"', TGI_SEEDED) for seed in seeds]
    lines = [re.sub(r'total_time="[^"]*" ', "", x) if i % 2 else x for i, x in enumerate(lines)]
    path.write_text("\n".join(lines) + "\n")
    result = ingest_paths([path])
    used = result.records["seed_used"]  # (the span's seed: the one the server used)
    assert sorted(int(s) for s in used) == sorted(seeds)  # in arrival order
    ingest_to_dir([path], folder / "out")
    written = read_records(folder / "out" / "records.parquet")["seed_used"]
    assert sorted(int(s) for s in written) == sorted(seeds)


def test_a_negative_or_fractional_seed_is_left_out_not_altered(tmp_path):
    path = tmp_path / "tgi.log"
    lines = [re.sub(r'seed="Some\(\d+\)"', f'seed="Some({v})"', TGI_SEEDED) for v in ("-3", "1.5")]
    path.write_text("\n".join(lines) + "\n")
    assert ingest_paths([path]).records[["seed", "seed_used"]].isna().all().all()


# --- 4. TGI 1.x request ids -----------------------------------------------------------------


def test_tgi_v1_trace_id_is_the_request_id():
    records = ingest_paths([SPEC_ONLY / "tgi-text-v1.txt"]).records
    http = [line for line in (SPEC_ONLY / "tgi-text-v1.txt").read_text().splitlines()]
    expected = [
        m.group(1) if (m := re.search(r" trace_id=([0-9a-f]{32})\}", line)) else None
        for line in http
        if "Success" in line or "ERROR" in line
    ]
    assert records["request_id"].tolist() == expected
    assert records["request_id"].notna().sum() >= 3


# --- 5. TGI debug Input joined to its own Success -------------------------------------------


def _json_event(ts: str, message: str, span: dict[str, str], level: str = "INFO") -> str:
    event = {"timestamp": ts, "level": level, "message": message,
             "target": "text_generation_router::server", "filename": "router/src/server.rs",
             "line_number": 432, "span": {**span, "name": "generate"}}  # fmt: skip
    return json.dumps({**event, "spans": [event["span"]]})


def test_interleaved_debug_inputs_join_the_success_of_their_request(tmp_path):
    params = "GenerateParameters { best_of: None, temperature: None, max_new_tokens: Some(8) }"
    base = {"parameters": params}

    def success(ts: str, total: str) -> str:
        timings = {"total_time": total, "inference_time": "10ms", "time_per_token": "1ms",
                   "queue_time": "1µs", "validation_time": "1µs", "seed": "None"}  # fmt: skip
        return _json_event(ts, "Success", {**base, **timings})

    lines = [
        _json_event("2025-06-03T09:00:00.000010Z", "Input: first prompt", base, "DEBUG"),
        _json_event("2025-06-03T09:00:00.100010Z", "Input: second prompt", base, "DEBUG"),
        success("2025-06-03T09:00:00.300012Z", "200.000001ms"),  # arrived at .1: the second
        success("2025-06-03T09:00:00.500012Z", "500.000001ms"),  # arrived at 0: the first
    ]
    path = tmp_path / "tgi.jsonl"
    path.write_text("\n".join(lines) + "\n")
    records = ingest_paths([path]).records.sort_values("e2e_s")
    assert records["prompt"].tolist() == ["second prompt", "first prompt"]


# --- 6. unbounded inputs --------------------------------------------------------------------

V011 = EXAMPLES / "vllm-v0.11.txt"


def test_gz_is_parsed_in_bounded_pieces_with_the_same_records(tmp_path):
    data = V011.read_bytes() * 400  # ~2.5 MB decompressed
    packed = tmp_path / "app.log.gz"
    packed.write_bytes(gzip.compress(data))
    plain = tmp_path / "app.log"
    plain.write_bytes(data)
    options = IngestOptions(year=2025, chunk_bytes=1 << 16)
    pieces = list(parse_pieces(ChunkSpec(str(packed), "vllm", 0, None), options))
    assert len(pieces) > 20 and max(len(p.heads) for p in pieces) < 200
    assert sum(p.lines for p in pieces) == data.count(b"\n")
    got, want = ingest_paths([packed], options), ingest_paths([plain], IngestOptions(year=2025))
    columns = ["ts", "request_id", "status", "output_tokens", "prompt", "prefix_hashes"]
    pd.testing.assert_frame_equal(got.records[columns], want.records[columns])
    assert got.summary[0].rejects.total == 0


def _peak_after_junk(path: Path, junk_lines: int) -> int:
    """Traced peak of ingesting a Success, ``junk_lines`` kB lines without a timestamp, and
    another Success (checks the records and rejects on the way)."""
    with open(path, "w") as out:
        out.write(TGI_V3[0] + "\n")
        for _ in range(junk_lines):
            out.write("x" * 1000 + "\n")
        out.write(TGI_V3[1] + "\n")
    tracemalloc.start()
    result = ingest_paths([path])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(result.records) == 2
    assert result.summary[0].rejects.counts == {"not a TGI log line": junk_lines}
    return peak


def test_lines_after_a_success_are_never_held(tmp_path):
    """The memory does not grow with the lines after an event: past a few blocks' worth,
    30 MB more of them cost nothing more (holding them would cost their 30 MB and more)."""
    small = _peak_after_junk(tmp_path / "small.log", 20_000)
    large = _peak_after_junk(tmp_path / "large.log", 50_000)
    assert large < small + (10 << 20)


def test_an_over_long_multiline_message_is_rejected_line_by_line(tmp_path):
    debug = (EXAMPLES / "tgi-text-v3-debug.txt").read_text().splitlines()
    path = tmp_path / "tgi.log"
    path.write_text("\n".join([debug[0], *(["y" * 100] * 50), *debug[1:]]) + "\n")
    result = ingest_paths([path], IngestOptions(max_line_bytes=2048))
    rejected = result.summary[0].rejects.counts["message too long"]
    assert rejected == 1 + 50 + sum(1 for x in debug[1:] if not x.startswith("2025"))
    assert len(result.records) == 1 and pd.isna(result.records["prompt"].iloc[0])


def test_symlinks_in_a_folder_are_not_followed_out_of_it(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.log").write_text("password=hunter2\n")
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "vllm.log").write_bytes(V011.read_bytes())
    (folder / "link.log").symlink_to(outside / "secret.log")
    (folder / "linked-dir").symlink_to(outside)
    result = ingest_paths([folder], IngestOptions(year=2025))
    text = json.dumps(result.summary_dict())
    assert "hunter2" not in text
    by_name = {Path(s.path).name: s for s in result.summary}
    assert by_name["link.log"].format == "skipped" and by_name["linked-dir"].format == "skipped"
    assert by_name["vllm.log"].records == 5


def test_cr_only_line_ends_do_not_merge_lines(tmp_path):
    path = tmp_path / "cr.log"
    path.write_bytes(V011.read_bytes().replace(b"\n", b"\r"))
    got = ingest_paths([path], IngestOptions(year=2025))
    want = ingest_paths([V011], IngestOptions(year=2025))
    columns = ["ts", "request_id", "status", "output_tokens", "prompt", "max_tokens"]
    pd.testing.assert_frame_equal(got.records[columns], want.records[columns])
    assert got.summary[0].rejects.total == 0 and got.summary[0].lines == want.summary[0].lines


def test_a_fifo_named_on_the_command_line_is_refused_by_name(tmp_path, capsys):
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    with pytest.raises(BadInputError, match="FIFO") as caught:
        ingest_paths([fifo])
    assert caught.value.where == str(fifo)
    with pytest.raises(SystemExit) as code:
        main(["ingest", str(fifo), "--out", str(tmp_path / "out")])
    assert code.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "FIFO" in err and str(fifo) in err
    folder = tmp_path / "with-fifo"
    folder.mkdir()
    os.mkfifo(folder / "pipe.log")
    (folder / "vllm.log").write_bytes(V011.read_bytes())
    result = ingest_paths([folder], IngestOptions(year=2025))  # never blocks on the pipe
    assert {s.format for s in result.summary} == {"vllm", "skipped"}


# --- 7. counts the log gives ----------------------------------------------------------------


def test_tgi_validation_errors_keep_the_prompt_length_they_print():
    for name, tokens, max_new in (("tgi-text-v2.txt", 4001, 100), ("tgi-text-v3.txt", 8150, 100)):
        records = ingest_paths([EXAMPLES / name]).records
        row = records[records["prompt_tokens"].notna()].iloc[0]
        assert row["status"] == "rejected"
        assert (row["prompt_tokens"], row["max_tokens"]) == (tokens, max_new)
