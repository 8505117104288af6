"""The column-wise reader of TGI ``Success`` lines cuts each line at its time and at its last
12 double quotes and reads the parts apart: lines whose quotes, time, handler or fields are
anything but the router's shape give what the per-line Python path gives, every common line is
read column-wise, and event times read by Arrow are the ones pandas reads."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.columnar import tgi_success_rows
from pipeline.ingest.lines import Lines
from pipeline.ingest.parse import heads_frame
from pipeline.ingest.summary import Rejects
from pipeline.ingest.tgi import ENDPOINTS, TgiChunkParser, arrival_ts, printed_parameters
from tests.conftest import SHARED_DATA

EXAMPLES = SHARED_DATA / "logs" / "examples"
SUCCESS = [
    line
    for name in ("tgi-text-v2.txt", "tgi-text-v3.txt", "tgi-text-v3-debug.txt")
    for line in (EXAMPLES / name).read_text().splitlines()
    if line.endswith(": Success")
]
QUOTED = next(line for line in SUCCESS if 'parameters="' in line)
RAW = next(line for line in SUCCESS if "parameters=GenerateParameters {" in line)


def _block(lines: list[str]) -> Lines:
    """``lines`` as the reader gives them: with their bytes (the Arrow array is cut from them)."""
    body = "".join(line + "\n" for line in lines).encode()
    return Lines(lines, body)


def _heads(lines: list[str], columnar: bool, as_block: bool = False) -> pd.DataFrame:
    result = ChunkResult("x.log", "tgi-text")
    result.rejects = Rejects("x.log")
    parser = TgiChunkParser(result, 16, json_lines=False, columnar=columnar)
    parser.feed(1, _block(lines) if as_block else lines)
    parser.finish()
    return heads_frame(result.heads, True, result.head_frames)


def _same_as_python_path(lines: list[str]) -> None:
    expected = _heads(lines, False)
    pd.testing.assert_frame_equal(_heads(lines, True), expected)
    pd.testing.assert_frame_equal(_heads(lines, True, as_block=True), expected)


def _read_column_wise(lines: list[str]) -> np.ndarray:
    cache: dict[str, dict[str, object]] = {}
    parser = TgiChunkParser(ChunkResult("x.log", "tgi-text"), 16, json_lines=False)

    def fields(text: str) -> dict[str, object]:
        return cache.setdefault(text, parser.parameter_fields(text))

    return tgi_success_rows(_block(lines), printed_parameters, fields, ENDPOINTS)[0]


def _sub(pattern: str, new: str, line: str = QUOTED) -> str:
    changed = re.sub(pattern, new, line, count=1)
    assert changed != line
    return changed


ODD_LINES = {
    "empty quoted parameters": _sub(r'parameters="(?:[^"\\]|\\.)*"', 'parameters=""'),
    "ANSI codes in the parameters": QUOTED.replace("best_of", "\x1b[31mbest_of", 1),
    "a lone escape in the parameters": RAW.replace("best_of", "\x1bbest_of", 1),
    "quotes in raw parameters": RAW.replace("stop: []", 'stop: ["a \\" b"]', 1),
    "total_time in raw parameters": _sub(r"best_of: None", 'best_of: x total_time="1s"', RAW),
    "no seed": _sub(r' seed="[^"]*"', ""),
    "an extra field": _sub(r' seed="', ' foo="bar" seed="'),
    "fields in another order": _sub(r'( queue_time="[^"]*")( inference_time="[^"]*")', r"\2\1"),
    "time to the millisecond": _sub(r"^(\S+T\d\d:\d\d:\d\d\.\d{3})\d{3}Z", r"\1Z"),
    "time to the nanosecond": _sub(r"^(\S+)Z", r"\g<1>123Z"),
    "time without a fraction": _sub(r"^(\S+)\.\d+Z", r"\1Z"),
    "no such day": _sub(r"^\d{4}-\d\d-\d\d", "2025-02-30"),
    "seed past 64 bits": _sub(r'seed="[^"]*"', 'seed="Some(18446744073709551616)"'),
    "seed with leading zeros": _sub(r'seed="[^"]*"', 'seed="Some(00000000000000000042)"'),
    "largest seed": _sub(r'seed="[^"]*"', 'seed="Some(18446744073709551615)"'),
    "seed None": _sub(r'seed="[^"]*"', 'seed="None"'),
    "non-ASCII digits": _sub(r'total_time="\d', 'total_time="١'),
    "a two-byte character before total_time": _sub(r'\}" total_time="', '}µ" total_time="'),
    "a backslash in a field": _sub(r'queue_time="[^"]*"', 'queue_time="1\\\\s"'),
    "one space before INFO": _sub(r"Z +INFO", "Z INFO"),
    "three spaces before INFO": _sub(r"Z +INFO", "Z   INFO"),
    "WARN": _sub(r" INFO ", " WARN "),
    "another handler": _sub(r" INFO \w+\{", " INFO other{"),
    "no parameters": _sub(r'parameters="(?:[^"\\]|\\.)*" ', ""),
    "child spans": _sub(r'"\}: ', '"}:generate:generate_stream: '),
    "more after Success": QUOTED + " now",
    "cut short": QUOTED[:-3],
    "no file": _sub(r" [\w/.-]+\.rs:\d+:", ""),
    "a quote at the end": QUOTED + '"',
    "twelve quotes only": '"' * 12,
    "time and twelve quotes": QUOTED[:27] + "  INFO generate{parameters=" + '"' * 12,
    "empty": "",
}


@pytest.mark.parametrize("name", list(ODD_LINES))
def test_an_odd_line_gives_what_the_python_path_gives(name):
    line = ODD_LINES[name]
    _same_as_python_path([QUOTED, line, RAW])


def test_odd_lines_together_give_what_the_python_path_gives():
    _same_as_python_path([*ODD_LINES.values(), *SUCCESS])


def test_the_router_lines_are_read_column_wise():
    assert _read_column_wise(SUCCESS).all()
    read = _read_column_wise(list(ODD_LINES.values()))
    taken = {name for name, hit in zip(ODD_LINES, read, strict=True) if hit}
    assert taken == {
        "quotes in raw parameters", "total_time in raw parameters", "no parameters",
        "seed with leading zeros", "largest seed", "seed None", "one space before INFO",
        "three spaces before INFO", "child spans", "a two-byte character before total_time",
        "no such day",  # (the time is kept as printed; it is read later: NaT)
    }  # fmt: skip


MUTATIONS = st.sampled_from(['"', "\\", "{", "}", " ", "=", ":", "1", ".", "µ", "\x1b", "Z", "x"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(SUCCESS),
    st.lists(st.tuples(st.floats(0, 1), st.integers(0, 2), MUTATIONS), min_size=1, max_size=3),
)
def test_a_mutated_line_gives_what_the_python_path_gives(line, edits):
    """A character inserted, replaced or dropped anywhere."""
    for at, how, char in edits:
        i = int(at * len(line))
        line = line[:i] + (char if how < 2 else "") + line[i + (how > 0) :]
    _same_as_python_path([SUCCESS[0], line, SUCCESS[-1]])


def _pandas_arrival(frame: pd.DataFrame) -> pd.Series:
    """:func:`arrival_ts` as it was, all times read by pandas."""
    ts = pd.to_datetime(frame["ts"].astype(str), utc=True, format="ISO8601", errors="coerce")
    seconds = frame["_ts_minus_s"].fillna(0.0).astype(float)
    known = seconds.abs() <= 100 * 365.25 * 86400
    back = pd.to_timedelta(seconds.where(known, 0.0), unit="s")
    return (ts - back).where(known).astype("datetime64[us, UTC]")


TIMES = [
    ["2025-06-03T08:20:00.885440Z", "1969-12-31T23:59:59.999999Z", "9999-12-31T23:59:59.999999Z"],
    ["2025-06-03T08:20:00.885440Z", "2025-06-03T08:20:00Z"],
    ["2025-06-03T08:20:00.885440Z", "2025-06-03T08:20:00.885440123Z"],
    ["2025-06-03T08:20:00.885440Z", None],
    ["2025-02-30T08:20:00.885440Z", "2025-06-03T08:20:00.885440Z"],
    ["2025-06-03T23:59:60.000000Z"],
    ["0000-01-01T00:00:00.000000Z"],
    ["2025-06-03T08:20:00.88544µZ"],
    ["2025-06-03T08:20:00.885440+"],
    [],
]


@pytest.mark.parametrize("times", TIMES)
@pytest.mark.parametrize("dtype", ["string", object])
def test_event_times_read_by_arrow_are_those_pandas_reads(times, dtype):
    frame = pd.DataFrame(
        {"ts": pd.Series(times, dtype=dtype),
         "_ts_minus_s": pd.Series([1.25] * len(times), dtype="Float64")},
        index=range(7, 7 + len(times)),
    )  # fmt: skip
    pd.testing.assert_series_equal(arrival_ts(frame), _pandas_arrival(frame))
