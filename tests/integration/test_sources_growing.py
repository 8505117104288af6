"""A source's file as an engine writes it: a half-written last line is never consumed, and once
it is whole it is read from where the last read stopped — every record exactly once, for every
kind of source, with the offsets in the store Redis."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from pipeline.ingest import IngestOptions, ingest_paths
from tasks.adapters.sources import SourceStates, read_new, source_id
from tasks.settings import EngineSettings, ScheduleSettings, Settings, SourceSettings
from tests.conftest import BROKER_URL, SHARED_DATA, STORE_URL

pytestmark = pytest.mark.integration

EXAMPLES = SHARED_DATA / "logs" / "examples"
TRACES = SHARED_DATA / "traces"


def _head(path: Path, lines: int | None = None) -> str:
    return "".join(path.read_text().splitlines(keepends=True)[:lines])


def _jsonl() -> str:
    rows = [{"ts": 1_780_000_000 + n, "request_id": f"gw-{n}", "model": "m", "tenant": "acme",
             "prompt": f"You are the assistant of team {n % 3}. " * 4, "prompt_tokens": 40 + n}
            for n in range(8)]  # fmt: skip
    return "".join(json.dumps(row) + "\n" for row in rows)


#: kind, file name, text, the format the whole file is read with
CASES = {
    "vllm-log": ("engine.log", lambda: _head(EXAMPLES / "vllm-v0.11.txt"), "vllm"),
    "tgi-log text": ("tgi.log", lambda: _head(EXAMPLES / "tgi-text-v3.txt"), None),
    "tgi-log json": ("tgi.jsonl", lambda: _head(EXAMPLES / "tgi-json-v3.jsonl"), None),
    "jsonl": ("gateway.jsonl", _jsonl, "prewarm-jsonl"),
    "trace mooncake": ("trace.jsonl", lambda: _head(TRACES / "conversation_trace.jsonl", 12),
                       None),
    "trace azure": ("azure.csv", lambda: _head(TRACES / "AzureLLMInferenceTrace_conv.csv", 12),
                    None),
}  # fmt: skip


def _settings(kind: str, path: Path) -> Settings:
    engine = EngineSettings(name="e", url="http://127.0.0.1:1", model="m")
    source = SourceSettings(engine="e", kind=kind.split()[0], path=str(path), year=2025)
    return Settings(redis_url=BROKER_URL, store_url=STORE_URL, engines=(engine,),
                    sources=(source,), schedule=ScheduleSettings(window_s=60))  # fmt: skip


def _ids(records: pd.DataFrame) -> Counter[tuple[str, str]]:
    # A record is told apart by its id (and tokens: a vLLM 4xx access line has no id). Not by
    # what later lines add: a vLLM request read before its last lines keeps the status it had
    # (follow-up lines in a later read join nothing twice), and an access line first in a read
    # has no time yet to borrow.
    return Counter(zip(records["request_id"].fillna("-").astype(str),
                       records["prompt_tokens"].astype(str), strict=True))  # fmt: skip


@pytest.mark.parametrize("where", ["middle", "last"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_half_written_last_line_is_read_once_when_it_is_whole(case, where, tmp_path, store):
    name, text_of, fmt = CASES[case]
    text = text_of().encode()  # offsets count bytes (TGI's "µs" are two)
    lines = text.splitlines(keepends=True)
    line = len(lines) // 2 if where == "middle" else len(lines) - 1
    whole_to = sum(map(len, lines[: line + 1]))
    cut = whole_to - len(lines[line]) // 2  # half of the line, no newline
    path = tmp_path / name
    path.write_bytes(text)
    whole = ingest_paths([path], IngestOptions(format=fmt, year=2025)).records
    settings = _settings(case, path)
    engine = settings.engines[0]
    source = source_id(settings.sources[0])
    offsets = SourceStates(store)

    reads = []
    line_start = whole_to - len(lines[line])
    # the half line is left; once whole, it is read; then the rest
    for n, (start, end, offset) in enumerate(
        [(0, cut, line_start), (cut, whole_to, whole_to), (whole_to, len(text), len(text))]
    ):
        with path.open("wb" if n == 0 else "ab") as out:
            out.write(text[start:end])
        new = read_new(settings, store, engine)
        [read] = new.reads
        assert read.error is None and read.rejected == 0, read
        assert offsets.load("e", source).files[str(path)].offset == offset  # in the store
        reads.append(new.records)
    read_ids = sum((_ids(r) for r in reads), Counter())
    assert read_ids == _ids(whole) and len(whole) > 0  # every record once: none twice, none lost
    assert len(read_new(settings, store, engine).records) == 0  # nothing new, nothing read
