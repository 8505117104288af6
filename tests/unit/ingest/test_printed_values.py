"""What a log prints inside its values never stops an ingest.

Values are printed by vLLM (Python ``repr``) and TGI (Rust ``Debug``, JSON) and can hold
anything a client sent or an engine computed: numbers past 64 bits, durations of centuries,
token ids that are no integers, escapes of no character. Each once raised out of the ingest
(``OverflowError``, ``ArrowInvalid``, ``OutOfBoundsTimedelta``, ``ValueError``). Such a value is
left out (the record keeps the rest) or its line is one reject; the run goes on.
"""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.ingest import IngestOptions, ingest_paths
from tests.unit.ingest.alike import EXAMPLES, FILES

OPTIONS = IngestOptions(year=2025)
#: what lands inside printed values: escapes, brackets, keys, huge and odd numbers, odd text
PRINTED = [
    "\\ud800", "\\U0010ffff", "\\x00", "\\u{110000}", "\\u{d800}", "\\'", '\\"', "\\\\", "\\n",
    "'", '"', "[", "]", "(", ")", "{", "}", ",", ": ", "None", "-1", "18446744073709551616",
    "99999999999999999999", "1e999", "nan", "inf", "\x00", "\u2028", "\x85", "é", "𝔘", "\r",
    "\x1b[0m", "Some(", "prompt_token_ids: [", "LoRARequest(lora_name='x'", "SamplingParams(",
    "seed=", "=", "µs", "ms", "0.000000001ns",
]  # fmt: skip


def _ingest(tmp_path: Path, name: str, lines: list[str]) -> pd.DataFrame:
    path = tmp_path / name
    text = "\n".join(lines) + "\n"
    path.write_text(text, encoding="utf-8")
    result = ingest_paths([path], OPTIONS)
    # every line is read (a CR ends a line too, as the reader has it)
    assert result.summary[0].lines == text.replace("\r\n", "\n").replace("\r", "\n").count("\n")
    return result.records


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(FILES),
    st.lists(
        st.tuples(
            st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from(PRINTED), st.booleans()
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_values_printed_with_anything_never_stop_an_ingest(tmp_path_factory, path, edits):
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for line_at, char_at, text, cut in edits:
        i = line_at % len(lines)
        line = lines[i]
        at = char_at % (len(line) + 1)
        changed = line[:at] + text + line[at + (3 if cut else 0) :]
        lines.insert(i + 1, changed)
    _ingest(tmp_path_factory.mktemp("printed"), path.name, lines)


def _tgi_success(**fields: str) -> str:
    line = next(
        line for line in (EXAMPLES / "tgi-text-v3.txt").read_text().splitlines()
        if line.endswith("Success") and "time_per_token" in line
    )  # fmt: skip
    for key, value in fields.items():
        start = line.index(f'{key}="') + len(key) + 2
        line = line[:start] + value + line[line.index('"', start) :]
    return line


def test_a_token_count_past_64_bits_is_left_out(tmp_path: Path) -> None:
    good = _tgi_success()
    huge = _tgi_success(inference_time="9000000000s", time_per_token="0.000000001ns")
    records = _ingest(tmp_path, "tgi.txt", [good, huge])
    assert records["output_tokens"].isna().tolist() == [False, True]
    assert records["e2e_s"].notna().all()


def test_a_total_time_of_centuries_leaves_the_arrival_unknown(tmp_path: Path) -> None:
    good = _tgi_success()
    centuries = _tgi_success(total_time="50218446744073716000s")
    records = _ingest(tmp_path, "tgi.txt", [good, centuries])
    assert len(records) == 2
    assert records["ts"].isna().sum() == 1
    assert records["e2e_s"].max() == 50218446744073716000.0


def test_printed_integers_past_64_bits_are_left_out(tmp_path: Path) -> None:
    lines = (EXAMPLES / "tgi-text-v3.txt").read_text().splitlines()
    given = next(i for i, line in enumerate(lines) if "Given: " in line)
    max_new = next(i for i, line in enumerate(lines) if "max_new_tokens: Some(" in line)
    changed = list(lines)
    huge = "99999999999999999999"  # (prepended to the printed number)
    changed[given] = lines[given].replace("Given: ", f"Given: {huge}", 1)
    changed[max_new] = lines[max_new].replace(
        "max_new_tokens: Some(", f"max_new_tokens: Some({huge}"
    )
    records = _ingest(tmp_path, "tgi.txt", changed)
    clean = _ingest(tmp_path, "clean.txt", lines)
    assert len(records) == len(clean)
    for column in ("prompt_tokens", "max_tokens"):
        assert records[column].isna().sum() == clean[column].isna().sum() + 1, column


def test_token_ids_that_are_no_integers_keep_the_request(tmp_path: Path) -> None:
    ids = ", ".join(str(random.Random(7).randrange(1000)) for _ in range(40))
    line = (
        "INFO 10-03 10:00:00 [logger.py:39] Received request cmpl-1-0: prompt: None, params: "
        "SamplingParams(n=1, temperature=0.7, max_tokens=5), prompt_token_ids: [{ids}], "
        "lora_request: None."
    )
    records = _ingest(tmp_path, "vllm.txt", [line.format(ids=ids), line.format(ids="x, " + ids)])
    assert len(records) == 2  # the second one's ids give no block hashes, the rest is kept
    chains = records["prefix_hashes"].tolist()
    assert len(chains[0]) == 40 // 16 and chains[1] is None
