"""The column-wise readers (TGI, vLLM) and the fast path (vLLM) give, line for line, what the
per-line Python path gives."""

from __future__ import annotations

import re
from itertools import islice

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.loggen import vllm_lines
from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.parse import heads_frame
from pipeline.ingest.summary import Rejects
from pipeline.ingest.tgi import TgiChunkParser
from pipeline.ingest.vllm import VllmChunkParser, whole_value, without_token_ids
from pipeline.ingest.vllm import request_lines as vllm_module
from tests.conftest import REPO_ROOT, SHARED_DATA

EXAMPLES = SHARED_DATA / "logs" / "examples"
TGI_LINES = [
    line
    for name in ("tgi-text-v2.txt", "tgi-text-v3.txt", "tgi-text-v3-debug.txt")
    for line in (EXAMPLES / name).read_text().splitlines()
]
SUCCESS = [line for line in TGI_LINES if line.endswith(": Success")]
DURATION = st.one_of(
    st.builds(lambda n, u: f"{n}{u}", st.decimals(0, 10**4, places=6).map(str),
              st.sampled_from(["s", "ms", "µs", "us", "ns", "m", ""])),
    st.sampled_from(["", "1.", ".5s", "NaNs", "１s", "0s", "0ns"]),
)  # fmt: skip
SEED = st.one_of(
    st.integers(0, 2**64 + 5).map(lambda v: f"Some({v})"),
    st.sampled_from(["None", "Some(-1)", "Some()", "7", "Some(1.5)"]),
)


@st.composite
def success_lines(draw: st.DrawFn) -> str:
    """A real ``Success`` line with its timings and seed replaced by drawn texts."""
    line = draw(st.sampled_from(SUCCESS))
    for name in ("total_time", "queue_time", "inference_time", "time_per_token"):
        if draw(st.integers(0, 4)) == 0:
            line = re.sub(rf' ?{name}="[^"]*"', "", line)
        else:
            line = re.sub(rf'{name}="[^"]*"', f'{name}="{draw(DURATION)}"', line)
    return re.sub(r'seed="[^"]*"', f'seed="{draw(SEED)}"', line)


def _heads(lines: list[str], columnar: bool) -> pd.DataFrame:
    result = ChunkResult("x.log", "tgi-text")
    result.rejects = Rejects("x.log")
    parser = TgiChunkParser(result, 16, json_lines=False, columnar=columnar)
    parser.feed(1, lines)
    parser.finish()
    return heads_frame(result.heads, True, result.head_frames)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(success_lines(), st.sampled_from(TGI_LINES)), max_size=20))
def test_tgi_success_lines_read_column_wise_equal_the_python_path(lines):
    pd.testing.assert_frame_equal(_heads(lines, True), _heads(lines, False))


VLLM_FILES = sorted(
    [*EXAMPLES.glob("vllm-*.txt"), *(REPO_ROOT / "tests" / "data" / "ingest").glob("vllm-*.txt"),
     REPO_ROOT / "tests" / "data" / "vllm-0.32-cpu-debug.log"]
)  # fmt: skip
VLLM_LINES = [line for path in VLLM_FILES for line in path.read_text().splitlines()]


def _vllm(lines: list[str], fast_path: bool) -> ChunkResult:
    result = ChunkResult("x.log", "vllm")
    result.rejects = Rejects("x.log")
    parser = VllmChunkParser(result, 4, "x.log", fast_path=fast_path)
    parser.feed(1, lines)
    return parser.finish()


def _same_vllm_result(lines: list[str]) -> None:
    got, want = _vllm(lines, True), _vllm(lines, False)
    assert got.heads == want.heads
    assert got.tails == want.tails
    assert got.metrics == want.metrics
    assert got.rejects.to_dict() == want.rejects.to_dict()
    assert got.ignored == want.ignored
    assert (got.first_ts, got.last_ts, got.rollovers) == (
        want.first_ts,
        want.last_ts,
        want.rollovers,
    )
    assert (got.cap_evidence, got.longest_prompt, got.longest_ids) == (
        want.cap_evidence, want.longest_prompt, want.longest_ids,
    )  # fmt: skip


def test_vllm_files_read_by_the_fast_path_equal_the_per_line_path():
    for path in VLLM_FILES:
        _same_vllm_result(path.read_text().splitlines())
    _same_vllm_result(list(islice(vllm_lines(), 4000)))


class _CountingParser(VllmChunkParser):
    """A parser that counts the lines it reads by the per-line path."""

    per_line = 0

    def _line(self, line: str, line_no: int) -> None:
        self.per_line += 1
        super()._line(line, line_no)


def test_generated_vllm_lines_are_read_by_the_fast_path():
    lines = list(islice(vllm_lines(), 4000))
    result = ChunkResult("x.log", "vllm")
    result.rejects = Rejects("x.log")
    parser = _CountingParser(result, 16, "x.log")
    parser.feed(1, lines)
    assert parser.per_line == 0  # access lines found column-wise, the rest by their envelope
    assert result.ignored["access line (joined by id only)"] == sum(
        ' - "POST ' in line for line in lines
    )


#: what lands in a real line, mostly in its envelope: colour codes, a CR, brackets, other
#: digits and spaces (Python's ``\\d`` and ``\\s`` read them, RE2's do not), a second envelope
_HOSTILE = st.sampled_from(
    ["", "'", '"', "\\", "\\n", "\x1b[0m", "\x1b[1;36m", "\r", "(", ")", "[", "]", ":", " ",
     "٣", "\u00a0", "\x0b", "é", "INFO 10-03 16:20:11 [x.py:12] ", "(APIServer pid=7) ", "DEBUG "]
)  # fmt: skip


@st.composite
def vllm_mutants(draw: st.DrawFn) -> str:
    line = draw(st.sampled_from(VLLM_LINES))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, min(len(line), 90)) | st.integers(0, len(line)))
        cut = draw(st.booleans())
        line = line[:at] if cut else line[:at] + draw(_HOSTILE) + line[at:]
    return line


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(vllm_mutants(), st.sampled_from(VLLM_LINES)), max_size=20))
def test_vllm_lines_read_by_the_fast_path_equal_the_per_line_path(lines):
    _same_vllm_result(lines)


@given(st.text(alphabet="[]()1, one", min_size=1, max_size=14) | st.just("None"))
def test_whole_values_read_by_find_agree_with_bracket_counts(value):
    closed = value.count("[") == value.count("]") and value.count("(") == value.count(")")
    assert whole_value(value) == (value == "None" or (value.endswith(("]", ")")) and closed))


_WITHOUT_TOKEN_IDS = without_token_ids
#: request lines that print a prompt and its token ids (the ids are counted, not read, when
#: the rest of the line is read by its text without them)
_WITH_IDS = [
    line for line in VLLM_LINES if "Received request" in line and "prompt_token_ids: [" in line
] + [line for line in islice(vllm_lines(), 400) if "prompt_token_ids: [" in line]
#: what may land in or after an id list: brackets, keys, other values, cuts
_ID_NOISE = st.sampled_from(
    ["", " ", ",", "1", "]", "[", "(", ")", ":", "x", "None", ", lora_request: None",
     ", prompt_embeds shape: None", ", prompt_adapter_request: None", ", prompt_token_ids: [7]",
     "LoRARequest(lora_name='a', lora_int_id=1)", "٣", "\u00a0"]
)  # fmt: skip


@st.composite
def id_list_mutants(draw: st.DrawFn) -> str:
    """A request line with token ids whose list (or what follows it) is changed."""
    line = draw(st.sampled_from(_WITH_IDS))
    start = line.rindex("prompt_token_ids: [") + len("prompt_token_ids: [")
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(start, len(line)))
        line = line[:at] + draw(_ID_NOISE) + line[at + draw(st.integers(0, 3)) :]
    return line


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(id_list_mutants(), st.sampled_from(_WITH_IDS)), max_size=12))
def test_token_ids_counted_apart_read_as_the_whole_rest(lines):
    _same_with_ids_counted_apart(lines)


def test_token_ids_after_a_lora_request_key_are_its_value_either_way():
    # found by the property test above: the whole rest's reader finds ", lora_request: "
    # before the ids, so a key printed before the list and not after it takes the list
    line = next(line for line in _WITH_IDS if line.endswith(", lora_request: None."))
    _same_with_ids_counted_apart(
        [line.replace(", lora_request: None.", ", lora_request: N, prompt_token_ids: [7].")]
    )


def _same_with_ids_counted_apart(lines: list[str]) -> None:
    got, want = [], []
    for out, cut in ((got, True), (want, False)):
        result = ChunkResult("x.log", "vllm")
        result.rejects = Rejects("x.log")
        parser = VllmChunkParser(result, 4, "x.log")
        if not cut:
            vllm_module.without_token_ids = lambda rest: (rest, None)
        try:
            parser.feed(1, lines)
        finally:
            vllm_module.without_token_ids = _WITHOUT_TOKEN_IDS
        parser.finish()
        out.append((result.heads, result.tails, result.rejects.to_dict(), result.cap_evidence,
                    result.longest_ids))  # fmt: skip
    assert got == want


#: the requests of the example logs and of generated ones, each as its lines in log order: a
#: request's later lines join the record its ``Received request`` line made (random lines of
#: many files seldom hold two lines of one request)
_REQUESTS = [
    [line for line in VLLM_LINES if request_id in line]
    for request_id in dict.fromkeys(
        re.findall(r"Generated response (\S+?)[ :]", "\n".join(VLLM_LINES))
    )
] + [list(islice(vllm_lines(seed), 4)) for seed in range(20)]
#: what may land in a ``Generated response`` line's output ids or finish reason: what lands in
#: an id list, and the pieces of the line's end
_OUTPUT_NOISE = _ID_NOISE | st.sampled_from(
    ["stop", "length", "abort", "\r", ", finish_reason: ", ", output_token_ids: [",
     " (streaming delta)"]
)  # fmt: skip


@st.composite
def request_mutants(draw: st.DrawFn) -> list[str]:
    """A request's lines, its ``Generated response`` lines changed after their output text."""
    lines = list(draw(st.sampled_from(_REQUESTS)))
    for i, line in enumerate(lines):
        if "Generated response" not in line or not draw(st.booleans()):
            continue
        start = line.find(": output: ")
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(max(start, 0), len(line)))
            line = line[:at] + draw(_OUTPUT_NOISE) + line[at + draw(st.integers(0, 2)) :]
        lines[i] = line
    return lines


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(request_mutants(), max_size=4))
def test_whole_requests_read_by_the_fast_path_equal_the_per_line_path(requests):
    _same_vllm_result([line for lines in requests for line in lines])
