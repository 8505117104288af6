"""vLLM's OpenTelemetry JSON log form (``vllm/logging_utils/oteljson.py``): every vLLM example
and spec log, written as that formatter writes it, reads as the text log with the year and
zone given; its own times (year included) are used; bad lines cost themselves."""

from __future__ import annotations

import functools
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.errors import BadInputError
from pipeline.ingest import IngestOptions, ingest_paths
from pipeline.ingest.detect import detect_format
from tests.unit.ingest.alike import FILES, assert_read_alike

VLLM_FILES = [p for p in FILES if detect_format(p) == "vllm"]
OPTIONS = IngestOptions(year=2025)
_SEVERITY = {"DEBUG": ("DEBUG", 5), "INFO": ("INFO", 9), "WARNING": ("WARN", 13),
             "ERROR": ("ERROR", 17), "CRITICAL": ("FATAL", 21)}  # fmt: skip
_CODES = re.compile(r"\x1b\[[0-9;]*m")
_TEXT = re.compile(
    r"(?:\([^()]+ pid=\d+\) )?.{0,64}?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d) \[?[^\]\s]+?:\d+\] (?P<body>.*)"
)
_ACCESS = re.compile(r"(?:\([^()]+ pid=\d+\) )?(?P<level>[A-Z]+):\s+(?P<body>\S* - \".*\" \d{3})")


def otel_line(level: str, when: datetime, body: str, logger: str) -> str:
    """One line as ``OTelJSONFormatter.format`` writes it (``json.dumps``: ASCII escapes)."""
    text, number = _SEVERITY[level]
    return json.dumps({
        "timestamp": when.isoformat().replace("+00:00", "Z"), "severity_text": text,
        "severity_number": number, "body": body, "logger": logger, "service.name": "vllm",
    })  # fmt: skip


def otel_log(text: str, year: int = 2025) -> tuple[str, int]:
    """A text log's envelope and access lines in the OTel form; and how many lines were left
    out (the text form's continuation lines, garbage)."""
    out, left_out, month = [], 0, 0
    for line in text.splitlines():
        line = _CODES.sub("", line)
        if found := _TEXT.match(line):
            if int(found["ts"][:2]) < month - 6:  # the text form's new year
                year += 1
            month = int(found["ts"][:2])
            when = datetime.strptime(f"{year}-{found['ts']}", "%Y-%m-%d %H:%M:%S")
            out.append(otel_line(found["level"], when.replace(tzinfo=UTC),
                                 found["body"], "vllm.entrypoints.logger"))  # fmt: skip
        elif found := _ACCESS.match(line):
            last = json.loads(out[-1])["timestamp"] if out else f"{year}-01-01T00:00:00Z"
            when = datetime.fromisoformat(last.replace("Z", "+00:00"))
            out.append(otel_line("INFO", when, found["body"], "uvicorn.access"))
        else:
            left_out += 1
    return "".join(line + "\n" for line in out), left_out


def _frames(result):
    records = result.records.drop(columns="ts").reset_index(drop=True)
    return records, result.records["ts"].reset_index(drop=True)


@pytest.mark.parametrize("source", VLLM_FILES, ids=lambda p: p.name)
def test_every_vllm_file_reads_alike_in_the_otel_form(tmp_path, source):
    lines, _ = otel_log(source.read_text(encoding="utf-8", errors="replace"))
    path = tmp_path / source.name
    path.write_text(lines, encoding="utf-8")
    otel = ingest_paths([path], OPTIONS)
    text = ingest_paths([source], OPTIONS)
    assert otel.summary[0].format == "vllm-otel-json"
    assert len(text.records) > 0 or len(text.metrics) > 0
    if len(otel.records) != len(text.records):  # (a request the conversion left out)
        pytest.fail(f"{len(otel.records)} records, {len(text.records)} in the text form")
    records, ts = _frames(otel)
    want, want_ts = _frames(text)
    pd.testing.assert_frame_equal(records, want)
    pd.testing.assert_series_equal(ts, want_ts)
    pd.testing.assert_frame_equal(otel.metrics, text.metrics, check_dtype=False)
    assert not any("year" in note for note in otel.summary[0].assumptions)


def test_each_line_keeps_its_own_year(tmp_path):
    source = next(p for p in VLLM_FILES if p.name == "vllm-v0.11.txt")
    lines, _ = otel_log(source.read_text(), year=2031)
    path = tmp_path / "vllm.jsonl"
    path.write_text(lines)
    records = ingest_paths([path], IngestOptions()).records  # no --year: none needed
    assert len(records) == 5 and (records["ts"].dt.year == 2031).all()


def test_bad_lines_cost_themselves(tmp_path):
    source = next(p for p in VLLM_FILES if p.name == "vllm-v0.11.txt")
    lines, _ = otel_log(source.read_text())
    good = lines.splitlines()
    bad = [good[0][:40], "not json", '{"timestamp": 1}', "", '{"severity_text": "LOUD"}']
    path = tmp_path / "vllm.jsonl"
    path.write_text("\n".join([good[0], *bad, *good[1:]]) + "\n")
    dirty = ingest_paths([path], OPTIONS)
    clean_path = tmp_path / "clean" / "vllm.jsonl"
    clean_path.parent.mkdir()
    clean_path.write_text(lines)
    clean = ingest_paths([clean_path], OPTIONS)
    pd.testing.assert_frame_equal(dirty.records, clean.records)
    assert dirty.summary[0].rejects.total == len(bad)


#: garbage a line of the OTel form can be next to: bytes that are no UTF-8, a blank line, a
#: lone ``\r``, a line past the cap, a cut-off copy of one of the file's own lines
_CAP = 32 << 10
_GARBAGE = st.one_of(
    st.binary(max_size=60).map(lambda b: b"\xff" + b.replace(b"\n", b"").replace(b"\r", b"")),
    st.just(b""), st.just(b"\r"), st.just(b"{" * (_CAP + 10)), st.just(b"note: not json"),
)  # fmt: skip


@functools.cache
def _otel_lines(source: Path) -> list[bytes]:
    text, _ = otel_log(source.read_text(encoding="utf-8", errors="replace"))
    return text.encode().split(b"\n")[:-1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VLLM_FILES), st.data())
def test_garbage_between_the_lines_costs_itself(tmp_path_factory, source, data):
    lines = _otel_lines(source)
    out, garbage = [], 0
    for line in [*lines, None]:
        cut = st.sampled_from(lines).flatmap(lambda x: st.integers(1, max(1, len(x) - 1)).map(
            lambda n, x=x: x[:n]))  # fmt: skip
        extra = data.draw(st.lists(st.one_of(_GARBAGE, cut), max_size=2))
        out.extend(extra)
        garbage += len(extra)
        if line is not None:
            out.append(line)
    folder = tmp_path_factory.mktemp("otel")
    clean, dirty = folder / "clean" / source.name, folder / "dirty" / source.name
    for path, body in ((clean, lines), (dirty, out)):
        path.parent.mkdir()
        path.write_bytes(b"".join(line + b"\n" for line in body))
    options = IngestOptions(year=2025, max_line_bytes=_CAP)
    assert_read_alike(ingest_paths([dirty], options), ingest_paths([clean], options), garbage)


def test_a_vllm_source_reads_either_form_of_its_log(tmp_path):
    """A ``vllm-log`` source (``source="vllm"``) detects vLLM's form per file; a file neither
    form reads is read as the text form, as that source always was."""
    source = next(p for p in VLLM_FILES if p.name == "vllm-v0.11.txt")
    otel = tmp_path / "otel.log"
    otel.write_text(otel_log(source.read_text())[0])
    unknown = tmp_path / "startup.log"
    unknown.write_text("Traceback (most recent call last):\n  nothing yet\n")
    options = IngestOptions(year=2025, source="vllm")
    summaries = ingest_paths([otel, source, unknown], options).summary
    assert [s.format for s in summaries] == ["vllm-otel-json", "vllm", "vllm"]
    assert [s.records for s in summaries] == [5, 5, 0]
    with pytest.raises(BadInputError, match="unknown source"):
        ingest_paths([source], IngestOptions(source="sglang"))
