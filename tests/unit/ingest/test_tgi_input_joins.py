"""``prewarm ingest`` of a TGI v3.3 DEBUG log under concurrency, as TGI prints it: ``Input:``
lines stamped 0.50-0.62 ms after the arrival their request's ``Output:`` gives (as a held-out
v3.3.7 log under load), errors of the request (overloaded, validation, generation), a streaming
``/v1/completions`` request whose ``Input:`` has no span, streamed `` `best_of` != 1 `` and
`` `decoder_input_details` == true `` rejected without a span, and bad lines between them.
Every request whose ``Input:`` TGI's output ties to it keeps its prompt (an error its arrival
too); one whose ``Input:`` could be another's keeps none; bad lines are counted and cost no
neighbour. Text and ``--json-output``.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from jobs.cli import main
from pipeline.ingest.sinks import read_records
from tests.unit.ingest.tgi_lines import (
    ENDPOINT,
    START_US,
    STREAM_ERRORS,
    Event,
    Request,
    timestamp,
)


def _request(i: int, handler: str, start_ms: float, lag_us: int, **shape: object) -> Request:
    shape.setdefault("total_ns", 200_000_000 + i * 97_000_013)
    return Request(handler, f"prompt {i}", START_US + int(start_ms * 1000), input_lag_us=lag_us,
                   success_lag_us=40 + i, error_lag_us=300 + 50 * i, **shape)  # fmt: skip


REQUESTS = [
    _request(0, "generate", 0.0, 500),
    _request(1, "generate", 2.1, 620),  # the same key as 0's, 2.1 ms later
    _request(2, "chat_completions", 0.3, 550, temperature=0.7),
    _request(3, "completions", 0.7, 600, stream=True),  # its Input: without a span
    _request(4, "completions", 5.0, 510),  # the same key as 3's
    _request(5, "generate_stream", 0.9, 580, temperature=0.7),
    _request(6, "generate", 1.0, 530, max_new_tokens=64, outcome="overloaded"),
    _request(7, "generate", 1.2, 540, max_new_tokens=128, outcome="rejected"),
    _request(8, "generate_stream", 1.5, 610, max_new_tokens=64, outcome="failed"),
    _request(9, "generate_stream", 1.7, 560, best_of=2, outcome="best_of"),
    _request(
        11, "generate_stream", 2.5, 590, decoder_input_details=True, outcome="prefill_details"
    ),
    # the same key as 2's, failing while 2 runs: either Input could be its
    _request(10, "chat_completions", 10.0, 520, temperature=0.7, outcome="failed"),
]
#: a request TGI's output cannot tie to its ``Input:``
UNTIED = {"prompt 10"}


def _log_lines(as_json: bool) -> tuple[list[str], int]:
    """The requests' lines in time order, a bad line after every other ``Success`` (after an
    ``Input:`` or ``Output:`` a text line without a time goes on its message); and how many
    bad lines."""
    events: list[Event] = sorted(
        (event for request in REQUESTS for event in request.events()), key=lambda e: e.at_us
    )
    bad = ["", '{"timestamp":"2025-06-03T09:41', "\x00\x01 not a line"] if as_json else [
        "", "garbage between events", f"{timestamp(START_US)}  INFO generate: Succ"]  # fmt: skip
    lines, successes = [], 0
    for event in events:
        lines.extend([event.json()] if as_json else event.text())
        if event.kind == "success":
            if successes % 2 == 0:
                lines.append(bad[successes // 2 % len(bad)])
            successes += 1
    return lines, (successes + 1) // 2


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_ingest_keeps_every_prompt_tgi_ties_to_its_request(tmp_path, capsys, as_json):
    lines, bad = _log_lines(as_json)
    log = tmp_path / ("tgi.jsonl" if as_json else "tgi.log")
    log.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "out"
    main(["ingest", str(log), "--out", str(out), "--json", "--workers", "1"])
    summary = json.loads(capsys.readouterr().out)["files"][0]
    assert summary["format"] == ("tgi-json" if as_json else "tgi-text")
    assert summary["records"] == len(REQUESTS)
    assert bad >= 3 and sum(summary["rejected"].values()) == bad, summary["rejected"]
    records = read_records(out / "records.parquet")
    by_prompt = records.dropna(subset=["prompt"]).set_index("prompt")
    assert set(by_prompt.index) == {r.prompt for r in REQUESTS} - UNTIED
    for request in REQUESTS:
        if request.prompt in UNTIED:
            continue
        row = by_prompt.loc[request.prompt]
        status = "rejected" if request.outcome in STREAM_ERRORS else request.outcome
        assert (row["status"], row["endpoint"]) == (status, ENDPOINT[request.handler])
        input_at = pd.Timestamp(timestamp(request.start_us + request.input_lag_us))
        if request.outcome == "ok":  # its arrival: its Success's time less its total time
            assert abs(row["ts"] - input_at) <= pd.Timedelta(milliseconds=1)
        else:  # an error's arrival: its Input's time
            assert row["ts"] == input_at, request
    untied = records[records["prompt"].isna()]
    assert untied["status"].tolist() == ["failed"]
    assert untied["endpoint"].tolist() == ["/v1/chat/completions"]
