"""TGI 3.x at DEBUG with concurrent requests: each request's lines come in TGI's order
(``Input:``; ``Token:`` lines of a stream; ``Output:`` and ``Success``, or an error), the lines
of concurrent requests interleaved in any order, the ``Success`` stamped up to 50 ms after its
request's timings were recorded (its ``Output:`` line's write waits for the launcher), and many
requests sharing a handler and parameters. Every request gets one record, and every field of it
is the request's own: its prompt (from its ``Input:``), status, endpoint, sampling parameters,
seeds and timings. Text and ``--json-output``, column-wise and line by line.

TGI prints no request id: two requests with the same handler and parameters whose clocks start
within a few microseconds of each other cannot be told apart in its output, so clocks here start
50 µs apart at least."""

from __future__ import annotations

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.parse import heads_frame
from pipeline.ingest.summary import Rejects
from pipeline.ingest.tgi import TgiChunkParser
from tests.unit.ingest.tgi_lines import Event, Request

START_US = 1_748_943_720_000_000
ENDPOINT = {
    "generate": "/generate",
    "generate_stream": "/generate_stream",
    "chat_completions": "/v1/chat/completions",
    "completions": "/v1/completions",
}


@st.composite
def requests(draw: st.DrawFn) -> list[Request]:
    """Concurrent requests of few shapes (handler and parameters often shared)."""
    count = draw(st.integers(2, 14))
    start, out = START_US, []
    for i in range(count):
        start += draw(st.integers(50, 30_000))  # µs between clock starts
        outcome = draw(st.sampled_from(["ok", "ok", "ok", "overloaded", "rejected", "failed"]))
        prompt = f"prompt {i}" + draw(st.sampled_from(["", " {x}", ' "quoted"', "\nline two"]))
        out.append(Request(
            handler=draw(st.sampled_from(list(ENDPOINT))),
            prompt=prompt,
            start_us=start,
            temperature=draw(st.sampled_from([None, 0.7])),
            max_new_tokens=draw(st.sampled_from([20, 64])),
            client_seed=draw(st.sampled_from([None, None, 42])),
            drawn_seed=draw(st.integers(0, 2**64 - 1)),
            outcome=outcome,
            total_ns=draw(st.integers(1_000_000, 3_000_000_000)),
            tokens=draw(st.integers(1, 50)),
            input_lag_us=draw(st.integers(0, 10)),
            output_lag_us=draw(st.integers(0, 10)),
            success_lag_us=draw(st.integers(0, 50_000)),
            error_lag_us=draw(st.integers(5, 500_000)),
        ))  # fmt: skip
    return out


def interleaved(data: st.DataObject, requests: list[Request]) -> list[Event]:
    """The requests' events merged in an order drawn by ``data``, each request's in its
    order."""
    queues = [r.events() for r in requests]
    merged: list[Event] = []
    while any(queues):
        live = [q for q in queues if q]
        merged.append(live[data.draw(st.integers(0, len(live) - 1))].pop(0))
    return merged


def _heads(events: list[Event], as_json: bool, columnar: bool) -> tuple[pd.DataFrame, list]:
    """Record heads of the printed events, and whose event each line is."""
    lines, owner = [], []
    for event in events:
        printed = [event.json()] if as_json else event.text()
        lines.extend(printed)
        owner.extend([event] * len(printed))
    result = ChunkResult("x.log", "tgi-json" if as_json else "tgi-text")
    result.rejects = Rejects("x.log")
    parser = TgiChunkParser(result, 16, json_lines=as_json, columnar=columnar)
    parser.feed(1, lines)
    parser.finish()
    assert result.rejects.total == 0, result.rejects.sample_lines()
    return heads_frame(result.heads, True, result.head_frames), owner


def _expected(request: Request) -> dict[str, object]:
    has_params = request.handler != "completions"
    done = request.outcome == "ok"
    rejected = request.outcome == "rejected"  # the message prints the requested max_new_tokens
    return {
        "status": request.outcome,
        "endpoint": ENDPOINT[request.handler],
        "prompt": request.prompt if done else None,
        "prompt_tokens": 8150 if rejected else None,
        "temperature": request.temperature if has_params else None,
        "max_tokens": request.max_new_tokens if has_params or rejected else None,
        "seed": request.client_seed if has_params else None,
        "seed_used": request.seed_used if done else None,
        "e2e_s": request.total_ns / 1e9 if done else None,
        "output_tokens": request.tokens if done else None,
    }


def _check(requests: list[Request], events: list[Event], as_json: bool, columnar: bool) -> None:
    heads, owner = _heads(events, as_json, columnar)
    outcome = {"success", "error"}
    assert len(heads) == len(requests)
    for _, row in heads.iterrows():
        event = owner[row["_line"] - 1]
        assert event.kind in outcome
        got = {key: None if pd.isna(row[key]) else row[key] for key in _expected(event.request)}
        if got["e2e_s"] is not None:
            got["e2e_s"] = round(got["e2e_s"], 9)
        assert got == _expected(event.request), (event.request, as_json, columnar)
    assert sorted(owner[line - 1].request.start_us for line in heads["_line"]) == [
        r.start_us for r in requests
    ]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.data())
def test_every_field_of_every_concurrent_request_is_its_own(requests, data):
    events = interleaved(data, requests)
    _check(requests, events, as_json=False, columnar=True)
    _check(requests, events, as_json=False, columnar=False)
    _check(requests, events, as_json=True, columnar=False)
