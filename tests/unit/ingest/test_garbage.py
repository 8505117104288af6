"""Property tests: garbage thrown at every parser never crashes it and never goes uncounted."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.lines import BOM, LineReader
from pipeline.ingest.parse import heads_frame
from pipeline.ingest.reprs import (
    PY_STR,
    decode_python_str,
    decode_rust_str,
    generate_parameters,
    parse_key_values,
    python_str_at,
    split_top_level,
)
from pipeline.ingest.run import write_part
from pipeline.ingest.summary import Rejects
from pipeline.ingest.tgi import TgiChunkParser, parse_spans, span_fields
from pipeline.ingest.traces import (
    azure_rows,
    counts_frame,
    jsonl_rows,
    mooncake_rows,
    servegen_rows,
)
from pipeline.ingest.vllm import VllmChunkParser
from tests.conftest import SHARED_DATA

EXAMPLES = SHARED_DATA / "logs" / "examples"
REAL_LINES = [
    line
    for path in sorted(EXAMPLES.iterdir())
    for line in path.read_text(encoding="utf-8").splitlines()
    if line
]
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _mutated() -> st.SearchStrategy[str]:
    """Real lines cut, spliced or sprinkled with hostile characters."""
    line = st.sampled_from(REAL_LINES)
    cut = st.tuples(line, st.integers(0, 3000)).map(lambda t: t[0][: t[1]])
    splice = st.tuples(line, line, st.integers(0, 2000)).map(lambda t: t[0][: t[2]] + t[1][t[2] :])
    noise = st.tuples(
        line, st.integers(0, 2000), st.text(alphabet="'\"\\()[]{},:= \x1b\r\x00é", max_size=8)
    )
    sprinkle = noise.map(lambda t: t[0][: t[1]] + t[2] + t[0][t[1] :])
    return st.one_of(cut, splice, sprinkle, st.text(max_size=300))


def _accounted(result: ChunkResult, lines: int) -> int:
    return result.rejects.total + sum(result.ignored.values())


@FAST
@given(st.lists(_mutated(), max_size=30))
def test_vllm_parser_survives_garbage(lines):
    result = ChunkResult("x.log", "vllm")
    result.rejects = Rejects("x.log")
    parser = VllmChunkParser(result, 4, "x.log")
    parser.feed(1, lines)
    parser.finish()
    assert _accounted(result, len(lines)) <= len(lines)
    for head in result.heads:
        assert head["ts"] is None or len(head["ts"]) == 14


@FAST
@given(st.lists(_mutated(), max_size=30), st.booleans())
def test_tgi_parsers_survive_garbage(lines, json_lines):
    result = ChunkResult("x.log", "tgi-json" if json_lines else "tgi-text")
    result.rejects = Rejects("x.log")
    parser = TgiChunkParser(result, 4, json_lines)
    parser.feed(1, lines)
    parser.finish()
    assert result.rejects.total <= len(lines)


@FAST
@given(st.text(max_size=400))
def test_python_repr_strings_round_trip(text):
    literal = repr(text)
    found = python_str_at(literal + ", params: x", 0)
    assert found == (text, len(literal))


def _rust_debug(text: str) -> str:
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif char in "\n\t\r\0":
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{{{ord(char):x}}}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


@FAST
@given(st.text(max_size=300))
def test_rust_debug_strings_round_trip(text):
    assert decode_rust_str(_rust_debug(text)) == text


@FAST
@given(st.text(max_size=300))
def test_splitters_and_scanners_never_raise(text):
    split_top_level(text)
    parse_key_values(text)
    generate_parameters(text)
    span_fields(text)
    _spans, pos = parse_spans(text)
    assert 0 <= pos <= len(text)


@FAST
@given(st.binary(max_size=3000), st.integers(1024, 4096))
def test_line_reader_loses_nothing_within_the_cap(data, cap):
    assume(
        not data.startswith((b"\x1f\x8b", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd", b"BZh"))
    )  # compressed
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.log"
        path.write_bytes(data)
        rejects = Rejects(str(path))
        reader = LineReader(path, rejects, max_line_bytes=cap)
        lines = [line for _, block in reader for line in block]
    text = data.removeprefix(BOM)  # a byte-order mark at the start is no line's
    raw = re.split(rb"\r\n|\r|\n", text)  # the three line endings, none kept
    if raw and raw[-1] == b"":
        raw.pop()
    kept = [r.decode("utf-8", "replace") for r in raw if len(r) <= cap]
    assert lines == kept
    assert rejects.counts["line too long"] == len(raw) - len(kept)
    assert reader.lines == len(raw)


#: values a trace row may print: counts past 64 bits, times past pandas' range (1677-2262)
_TRACE_VALUES = st.one_of(
    st.integers(-5, 10**20),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=10),
    st.none(),
    st.lists(st.integers(-3, 3), max_size=5),
    st.booleans(),
    st.sampled_from(["2025-06-03T09:41:17Z", "3000-01-01", "1600-01-01T00:00:00Z", "812"]),
)
_TRACE_KEYS = st.sampled_from(
    ["ts", "timestamp", "input_length", "output_length", "hash_ids", "prompt", "token_ids",
     "prefix_hashes", "prompt_tokens", "output_tokens", "seed", "temperature", "top_k",
     "prompt_truncated", "tenant", "ttft_s"]
)  # fmt: skip
_CSV_ROWS = st.tuples(
    st.sampled_from(["2023-11-16 18:17:03.9799600", "3000-01-01 00:00:00", "0", "1e300"]),
    st.sampled_from(["4808", "1e300", str(2**64), "-1", "x", "Weibull"]),
    st.sampled_from(["10", str(2**63), "0.5"]),
    st.sampled_from(["", ",Weibull,1,2", ",Gamma,0.5,1e300"]),
).map(lambda t: ",".join(t))


@FAST
@given(st.lists(st.one_of(st.text(max_size=80), _CSV_ROWS,
                          st.builds(json.dumps, st.dictionaries(_TRACE_KEYS, _TRACE_VALUES))),
                max_size=20))  # fmt: skip
def test_trace_readers_count_every_bad_row(lines):
    """Every line is a row or a reject, and the rows kept become columns: a value its column
    cannot hold (a count past 64 bits, a time past 2262) rejects its row, not the file."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "chunk-3-trace.csv"
        text = "\n".join(line.replace("\n", " ").replace("\r", " ") for line in lines) + "\n"
        path.write_text(text)
        # (a byte-order mark at the start of the file is no line's)
        nonblank = sum(1 for line in text.removeprefix("\ufeff").split("\n") if line.strip())
        for read in (mooncake_rows, jsonl_rows, azure_rows, servegen_rows):
            rejects = Rejects(str(path))
            rows = read(path, rejects)  # type: ignore[operator]
            if read in (mooncake_rows, jsonl_rows):  # no line is skipped on purpose
                assert len(rows) + rejects.total == nonblank
            else:  # a CSV header and idle ServeGen windows are skipped, not rejected
                assert len(rows) + rejects.total <= nonblank
            if read is servegen_rows:
                counts_frame(rows)
            else:
                write_part(heads_frame(rows, text_ts=False), str(Path(folder) / "heads.arrow"))


@FAST
@given(st.text(alphabet=st.sampled_from("ab'\"\\nx\n é"), max_size=40), st.integers(0, 3))
def test_python_literals_read_by_find_are_those_of_the_pattern(text, pos):
    """The ``str.find`` reading of the usual literal agrees with :data:`PY_STR` on any text,
    literal or not (quotes, backslashes and ``n`` drawn often)."""
    match = PY_STR.match(text, pos)
    want = None if match is None else (decode_python_str(match.group()), match.end())
    if text.startswith("None", pos):
        want = (None, pos + 4)
    assert python_str_at(text, pos) == want


def test_a_request_line_cut_inside_its_first_words_is_one_reject():
    for cut in ("details: promp", "abor", "f", "", None):
        message = "Request chatcmpl-1" + ("" if cut is None else " " + cut)
        result = ChunkResult("x.log", "vllm")
        result.rejects = Rejects("x.log")
        parser = VllmChunkParser(result, 4, "x.log")
        parser.feed(1, ["INFO 02-10 09:15:01 [logger.py:39] " + message])
        parser.finish()
        assert result.rejects.counts == {"cut-off line": 1} and not result.ignored, message
