"""Garbage lines between the lines of every example log cost themselves only.

For each example of FORMATS.md and each spec-only variant, garbage lines are inserted before
and after lines of the file (binary, blank, a lone ``\\r``, a Rust panic line, a line over
the line cap, and cut-off copies of the file's own request lines). Every record and metrics
row must come out exactly as from the clean file, nothing may be counted as ignored that was
not, and each garbage line must be counted once as rejected.

Two limits come from the formats, not from the parser:

* Inside and right after a TGI message printed raw over several lines (``Input:``,
  ``Output:``, a backend's Python exception), a line without a timestamp *is* the next line
  of that message (FORMATS.md 2.8): only garbage no message can hold is inserted there
  (invalid UTF-8, over the cap).
* A line cut inside its message can be a shorter well-formed message (``Given: 50`` of
  ``Given: 5000``), so the cut-off copies are of lines whose end the format marks: vLLM
  ``Received request`` / ``Request … details`` lines (they end with ``.`` after closed lists),
  TGI ``Success`` events and every TGI JSON line.
"""

from __future__ import annotations

import functools
import gzip
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.ingest import IngestOptions, ingest_paths
from pipeline.ingest.lines import BOM
from pipeline.ingest.tgi import EVENT_START
from pipeline.ingest.vllm import ANSI
from tests.unit.ingest.alike import FILES, assert_read_alike, read_pair

CAP = 32 << 10
OPTIONS = IngestOptions(year=2025, max_line_bytes=CAP)
PANIC = (
    b"thread 'tokio-runtime-worker' panicked at 'called `Result::unwrap()` on an `Err` value',"
    b" router/src/main.rs:10:5"
)
BINARY = st.binary(max_size=60).map(lambda b: b"\xff" + b.replace(b"\n", b"").replace(b"\r", b""))
#: garbage no multi-line message can hold
ALWAYS = st.one_of(BINARY, st.just(b"o" * (CAP + 100)))
ANYWHERE = st.one_of(ALWAYS, st.just(b""), st.just(b"\r"), st.just(PANIC), st.just(b"note: x"))
#: garbage in a request log read by the trace readers, where a blank line is neither a record nor
#: a reject (as in every trace format): the rest of ``ANYWHERE``
IN_TRACES = st.one_of(ALWAYS, st.just(PANIC), st.just(b"note: x"))
#: the example files read by the trace readers (LiteLLM's request log, prewarm's callback)
TRACE_FILES = ("litellm-",)
#: the messages TGI prints raw, over several lines (``tgi._MULTILINE``): a prompt, a generated
#: text, a Python exception's text
MULTILINE = re.compile(
    r"\.rs:\d+: (?:Input: |Output: |Request failed during generation|Server error)"
)


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


def _cuttable(path: Path, line: bytes) -> bool:
    text = line.decode("utf-8", "replace")
    if path.suffix == ".jsonl":
        return True
    if path.name.startswith("tgi"):
        return text.endswith(": Success")
    return "] Received request " in text or ("] Request " in text and " details: " in text)


def _inside_message(path: Path, lines: list[bytes]) -> list[bool]:
    """For each gap (before line i, and after the last), whether a text line there would be
    the next line of a TGI message printed raw."""
    inside, current = [], False
    for line in lines:
        text = ANSI.sub("", line.decode("utf-8", "replace"))
        if EVENT_START.match(text):
            current = bool(MULTILINE.search(text))
        inside.append(current and path.name.startswith("tgi-text"))
    return [False, *inside[:-1], inside[-1] if inside else False]


@st.composite
def garbled(draw: st.DrawFn) -> tuple[Path, bytes, int]:
    """An example file with garbage inserted in some of its gaps, and how many lines."""
    path = draw(st.sampled_from(FILES))
    lines = _lines(path)
    cuts = [line for line in lines if _cuttable(path, line)]
    inside = _inside_message(path, lines)
    trace = path.name.startswith(TRACE_FILES)
    out, count = [], 0
    for gap in range(len(lines) + 1):
        kinds = ALWAYS if inside[gap] else IN_TRACES if trace else ANYWHERE
        if cuts and not inside[gap]:
            cut = st.tuples(st.sampled_from(cuts), st.floats(0.01, 0.99))
            kinds = st.one_of(kinds, cut.map(lambda t: t[0][: max(1, int(len(t[0]) * t[1]))]))
        extra = draw(st.lists(kinds, max_size=2)) if draw(st.integers(0, 3)) == 0 else []
        out.extend(extra)
        count += len(extra)
        if gap < len(lines):
            out.append(lines[gap])
    return path, b"\n".join(out) + b"\n", count


def _parse(path: Path):
    result = ingest_paths([path], OPTIONS)
    return result, result.summary[0]


@functools.cache
def _clean(path: Path):
    return _parse(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(garbled())
def test_every_good_record_survives_and_each_garbage_line_is_one_reject(tmp_path_factory, case):
    source, data, garbage = case
    dirty_path = tmp_path_factory.mktemp("garbage") / source.name  # same name: same instance
    dirty_path.write_bytes(data)
    assert_read_alike(_parse(dirty_path)[0], _clean(source)[0], garbage)


@pytest.mark.parametrize("source", FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gz"])
def test_a_byte_order_mark_at_the_start_changes_nothing(tmp_path, source, compressed):
    """A UTF-8 BOM (an editor's, an exporter's) is not part of the first line: the first
    record survives, and nothing more is rejected or ignored."""
    name, data = source.name, source.read_bytes()
    pack = gzip.compress if compressed else bytes
    marked, clean = read_pair(
        tmp_path, name + (".gz" if compressed else ""), pack(data), pack(BOM + data), OPTIONS
    )
    assert_read_alike(marked, clean)
    assert len(clean.records) > 0 or len(clean.metrics) > 0
