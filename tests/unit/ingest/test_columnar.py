"""The column-wise readers give, line for line, what the per-line Python path gives."""

from __future__ import annotations

import re

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.parse import heads_frame
from pipeline.ingest.summary import Rejects
from pipeline.ingest.tgi import TgiChunkParser
from tests.conftest import SHARED_DATA

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
