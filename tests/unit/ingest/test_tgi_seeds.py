"""A TGI record's ``seed`` is the seed the client asked for (``GenerateParameters { seed }``),
never the one the server drew for a sampling request that asked for none: that one, printed in
the span's ``seed`` field, is ``seed_used``; the parameters' hash is the client's. TGI v1.0 and
v3.x, text and ``--json-output``, read column-wise and line by line."""

from __future__ import annotations

import pandas as pd
import pytest

from pipeline.ingest import IngestOptions, ingest_paths
from tests.unit.ingest.tgi_lines import Request

START_US = 1_748_943_720_000_000
DRAWN = 5730125847162003291
DRAWN_PAST_I64 = 17260921448817315329  # a u64 above 2**63, kept exactly


def _requests(version: int) -> list[Request]:
    """Sampling without a seed (twice, the server drawing two), with one, and greedy."""
    shapes = [
        {"temperature": 0.7, "drawn_seed": DRAWN},
        {"temperature": 0.7, "drawn_seed": DRAWN_PAST_I64},
        {"temperature": 0.7, "client_seed": 42, "drawn_seed": DRAWN},
        {"temperature": None, "drawn_seed": DRAWN},
    ]
    handlers = ["generate", "generate_stream"] + (["chat_completions"] if version == 3 else [])
    return [
        Request(handler, f"prompt {i}", START_US + i * 1_000_000, version=version, **shape)
        for i, (handler, shape) in enumerate(
            (handler, shape) for handler in handlers for shape in shapes
        )
    ]


def _records(tmp_path, requests: list[Request], as_json: bool) -> pd.DataFrame:
    events = [e for r in requests for e in r.events() if e.kind == "success"]
    lines = [e.json() for e in events] if as_json else [t for e in events for t in e.text()]
    path = tmp_path / ("tgi.jsonl" if as_json else "tgi.log")
    path.write_text("".join(line + "\n" for line in lines))
    result = ingest_paths([path], IngestOptions(workers=1))
    assert result.summary[0].format == ("tgi-json" if as_json else "tgi-text")
    assert result.summary[0].rejects.total == 0, result.summary[0].rejects.sample_lines()
    return result.records


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("version", [1, 3], ids=["v1.0", "v3"])
def test_seed_is_the_clients_and_seed_used_the_servers(tmp_path, version, as_json):
    requests = _requests(version)
    records = _records(tmp_path, requests, as_json)
    assert len(records) == len(requests)
    for request, (_, row) in zip(requests, records.iterrows(), strict=True):
        expected = (request.client_seed, request.seed_used)
        got = tuple(None if pd.isna(row[c]) else int(row[c]) for c in ("seed", "seed_used"))
        assert got == expected, (request.handler, request.temperature, got, expected)
    by_shape = records["params_hash"].to_numpy().reshape(-1, 4)
    # two requests that differ only in the seed the server drew are the same request
    assert (by_shape[:, 0] == by_shape[:, 1]).all()
    assert (by_shape[:, 0] != by_shape[:, 2]).all()  # a seed the client sent is part of it
