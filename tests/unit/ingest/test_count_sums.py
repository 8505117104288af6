"""Window counts of many chunks summed: by sorting, exactly what a group-by and a sort give."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.ingest import sinks
from pipeline.ingest.count_sums import COUNT_KEYS, sum_counts
from pipeline.ingest.sinks import MemorySink, counts_table
from pipeline.windows import COUNT_DTYPES

T0 = pd.Timestamp("2025-01-01T00:00:00Z")
#: keys that order differently by bytes than by their first seven: empty, NUL bytes, a
#: shared long prefix, a shorter prefix of another, non-ASCII
KEYS = ["", "\x00", "a", "a\x00", "a\x00b", "abcdefg", "abcdefgh", "abcdefgi", "abcdefg\x00",
        "é", "e\u0301", "\U0001f600", "ff00aa11bb22cc33", "ff00aa11bb22cc34", "z"]  # fmt: skip
KINDS = ["prefix", "prompt", "tenant", "model", "", "p"]

rows = st.tuples(
    st.sampled_from(KINDS),
    st.sampled_from(KEYS),
    st.integers(0, 40),
    st.integers(1, 5),
    st.integers(0, 10**12),
    st.integers(-3, 3),
)


def _frame(part: list[tuple]) -> pd.DataFrame:
    columns = ["item_kind", "item_key", "minute", "requests", "prompt_tokens", "output_tokens"]
    frame = pd.DataFrame(part, columns=columns)
    frame["window_start"] = T0 + pd.to_timedelta(frame.pop("minute") * 10, unit="min")
    frame = frame.groupby(COUNT_KEYS, as_index=False).sum()  # one chunk's counts: keys unique
    return frame.astype(COUNT_DTYPES)


def _expected(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Summed by pandas and sorted by code points (UTF-8's byte order)."""
    whole = pd.concat(parts).groupby(COUNT_KEYS, as_index=False).sum()
    return whole.sort_values(COUNT_KEYS, ignore_index=True).astype(COUNT_DTYPES)


def _frame_of(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas().astype(COUNT_DTYPES)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(rows, min_size=1, max_size=30), min_size=1, max_size=5))
def test_summed_counts_equal_a_group_by_sorted(parts):
    frames = [_frame(p) for p in parts]
    got = sum_counts([counts_table(f) for f in frames])
    pd.testing.assert_frame_equal(_frame_of(got), _expected(frames))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(rows, min_size=1, max_size=30), min_size=1, max_size=8))
def test_a_sink_sums_its_buckets_as_all_counts_at_once(parts):
    """However often a bucket is summed on the way, the sink's counts are those of all."""
    frames = [_frame(p) for p in parts]
    for sum_at in (1, 7, 10**9):
        sinks.SUM_AT_ROWS, kept = sum_at, sinks.SUM_AT_ROWS
        try:
            sink = MemorySink("10min")
            for frame in frames:
                sink.add_counts(frame)
            got = sink.summed_counts()
        finally:
            sinks.SUM_AT_ROWS = kept
        pd.testing.assert_frame_equal(_frame_of(got), _expected(frames))


def test_more_kinds_than_an_integer_holds_are_summed_by_a_group_by():
    frame = pd.DataFrame(
        {"item_kind": [f"k{i:03d}" for i in range(300)] * 2, "item_key": ["x"] * 600,
         "window_start": [T0] * 600, "requests": [1] * 600, "prompt_tokens": [2] * 600,
         "output_tokens": [0] * 600}
    ).astype(COUNT_DTYPES)  # fmt: skip
    got = _frame_of(sum_counts([counts_table(frame[:300]), counts_table(frame[300:])]))
    assert got["requests"].tolist() == [2] * 300
    assert got["item_kind"].is_monotonic_increasing


def test_no_counts_sum_to_an_empty_table():
    assert sum_counts([]).num_rows == 0


#: keys of one width within a kind (gathered as a byte matrix) and of several (by Arrow)
HEX_KEYS = ["00ff00ff00ff00ff", "0a1b2c3d4e5f6a7b", "0a1b2c3d4e5f6a7c", "ffffffffffffffff"]
WIDE_KEYS = [*HEX_KEYS, "m", "model-b"]
fixed_rows = st.tuples(
    st.sampled_from(["prefix", "prompt", "model"]),
    st.integers(0, 3),
    st.integers(0, 40),
    st.integers(1, 5),
    st.integers(0, 10**12),
    st.integers(-3, 3),
)


def _fixed_width_frame(part: list[tuple], nested: bool) -> pd.DataFrame:
    """A chunk's counts: prefix and prompt keys all 16 hex digits, model keys of two widths
    (``nested``: a 16-digit one among them)."""
    rows = [
        (kind, (WIDE_KEYS[2 + k] if nested else WIDE_KEYS[4 + k % 2]) if kind == "model"
         else HEX_KEYS[k], *rest)
        for kind, k, *rest in part
    ]  # fmt: skip
    return _frame(rows)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(fixed_rows, min_size=1, max_size=30), min_size=1, max_size=5),
       st.booleans())  # fmt: skip
def test_keys_of_one_width_are_gathered_as_arrow_takes_them(parts, nested):
    frames = [_fixed_width_frame(p, nested) for p in parts]
    tables = [counts_table(f) for f in frames]
    got = sum_counts([t.slice(1) if t.num_rows > 1 and i % 2 else t for i, t in enumerate(tables)])
    kept = [f.iloc[1:] if len(f) > 1 and i % 2 else f for i, f in enumerate(frames)]
    pd.testing.assert_frame_equal(_frame_of(got), _expected(kept))
