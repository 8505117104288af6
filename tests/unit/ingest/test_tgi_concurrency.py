"""TGI 3.x at DEBUG with concurrent requests: each request's lines come in TGI's order
(``Input:``; ``Token:`` lines of a stream; ``Output:`` and ``Success``, or an error), the lines
of concurrent requests interleaved in any order, the ``Success`` stamped up to 50 ms after its
request's timings were recorded (its ``Output:`` line's write waits for the launcher), and many
requests sharing a handler and parameters. Every request gets one record, and every field of it
is the request's own: its prompt (from its ``Input:``), status, endpoint, sampling parameters,
seeds and timings. Text and ``--json-output``, column-wise and line by line.

An error takes its ``Input:`` (prompt and arrival) exactly where TGI's output says which is
its: the only one of its handler and parameters pending and stamped before it (for the
span-less stream-only errors, `` `best_of` != 1 `` and `` `decoder_input_details` == true ``:
the only streamed one asking for it); else none.

TGI prints no request id: two requests with the same handler and parameters whose clocks start
closer than their ``Input:`` lines' lag cannot be told apart in its output, so clocks here start
50 µs apart at least with lags of 10 µs at most, and 2.05 ms apart (twice the 1 ms lag TGI's
stamps allow, :data:`~pipeline.ingest.tgi.inputs.INPUT_LAG_S`) where lags go up to 1 ms; and no
two requests print the same timings (``total_time`` to the nanosecond: lines alike in all but
their time could be either's)."""

from __future__ import annotations

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.parse import heads_frame
from pipeline.ingest.summary import Rejects
from pipeline.ingest.tgi import TgiChunkParser, arrival_ts
from tests.unit.ingest.tgi_lines import (
    ENDPOINT,
    START_US,
    STREAM_ERRORS,
    Event,
    Request,
    timestamp,
)

#: same-key clocks start this far apart where ``Input:`` lines lag up to 1 ms
SEPARATION_US = 2 * 1000 + 50


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
            total_ns=draw(st.integers(1_000_000, 3_000_000_000)) + i,  # (ns: no two alike)
            tokens=draw(st.integers(1, 50)),
            input_lag_us=draw(st.integers(0, 10)),
            output_lag_us=draw(st.integers(0, 10)),
            success_lag_us=draw(st.integers(0, 50_000)),
            error_lag_us=draw(st.integers(5, 500_000)),
        ))  # fmt: skip
    return out


def join_key(request: Request) -> tuple[object, ...]:
    """What TGI prints that ties a request's lines: its handler and parameters (the span-less
    stream-only errors: a streamed request asking for what the error names)."""
    if request.outcome in STREAM_ERRORS:
        return (request.outcome,)
    params = None if request.handler == "completions" else request.parameters()
    return request.handler, params


@st.composite
def lagging_requests(draw: st.DrawFn) -> list[Request]:
    """Concurrent requests whose ``Input:`` lines lag up to 1 ms (TGI v3.3.7 under load):
    errors, streaming ``/v1/completions`` (a span-less ``Input:``) and the span-less
    stream-only errors (``best_of``, ``decoder_input_details``); same-key clocks start
    :data:`SEPARATION_US` apart at least."""
    count = draw(st.integers(2, 14))
    start, out = START_US, []
    for i in range(count):
        start += draw(st.integers(50, 3_000))
        outcome = draw(st.sampled_from(["ok", "ok", "ok", "overloaded", "rejected", "failed",
                                        *STREAM_ERRORS]))  # fmt: skip
        handler = draw(st.sampled_from(list(ENDPOINT)))
        if outcome in STREAM_ERRORS:
            handler = "generate_stream"
        request = Request(
            handler=handler, prompt=f"prompt {i}" + draw(st.sampled_from(["", "\nline two"])),
            start_us=start, stream=draw(st.booleans()),
            best_of=2 if outcome == "best_of" else None,
            decoder_input_details=outcome == "prefill_details",
            temperature=draw(st.sampled_from([None, 0.7])), outcome=outcome,
            total_ns=draw(st.integers(1_000_000, 3_000_000_000)) + i,  # (ns: no two alike)
            input_lag_us=draw(st.integers(0, 1000)), output_lag_us=draw(st.integers(0, 10)),
            success_lag_us=draw(st.integers(0, 50_000)),
            error_lag_us=draw(st.integers(5, 500_000)),
        )  # fmt: skip
        if any(join_key(r) == join_key(request) and start - r.start_us < SEPARATION_US
               for r in out):  # fmt: skip
            request.handler, request.outcome, request.best_of = "generate", "rejected", None
            request.decoder_input_details = False
            request.max_new_tokens = 100 + i  # a key of its own
        out.append(request)
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


def error_takes_input(events: list[Event], at: int, prompted: set[int]) -> bool:
    """Whether TGI's output ties the error ``events[at]`` to its request's ``Input:``: the
    only one of its key printed and stamped before it, and not taken yet (its request not ended
    before it, or ended by an error that took no ``Input:``: ``prompted`` holds those that
    did)."""
    error = events[at]
    ended = {id(e.request) for e in events[:at] if e.kind in ("success", "error")}
    waiting = [
        e.request
        for e in events[:at]
        if e.kind == "input"
        and join_key(e.request) == join_key(error.request)
        and e.at_us <= error.at_us
        and (
            id(e.request) not in ended
            or (e.request.outcome != "ok" and id(e.request) not in prompted)
        )
    ]
    return waiting == [error.request]


def _expected(request: Request, joined: bool) -> dict[str, object]:
    """The record of ``request``; ``joined``: an error that took its ``Input:``."""
    spanless = request.outcome in STREAM_ERRORS
    has_params = request.handler != "completions" and (joined or not spanless)
    done = request.outcome == "ok"
    rejected = request.outcome == "rejected"  # the message prints the requested max_new_tokens
    return {
        "status": "rejected" if spanless else request.outcome,
        "endpoint": None if spanless and not joined else ENDPOINT[request.handler],
        "prompt": request.prompt if done or joined else None,
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
    heads["arrival"] = arrival_ts(heads)
    prompted: set[int] = set()
    for _, row in heads.sort_values("_line").iterrows():
        event = owner[row["_line"] - 1]
        assert event.kind in outcome
        joined = event.kind == "error" and error_takes_input(events, events.index(event), prompted)
        expected = _expected(event.request, joined)
        got = {key: None if pd.isna(row[key]) else row[key] for key in expected}
        if got["e2e_s"] is not None:
            got["e2e_s"] = round(got["e2e_s"], 9)
        assert got == expected, (event.request, as_json, columnar)
        if event.kind == "error":  # an error's arrival: its Input's time, else its own
            at_us = event.request.start_us + event.request.input_lag_us if joined else event.at_us
            assert row["arrival"] == pd.Timestamp(timestamp(at_us)), (event.request, joined)
            prompted.update([id(event.request)] if joined else [])
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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lagging_requests(), st.data())
def test_inputs_lagging_up_to_1ms_join_their_own_request_and_no_other(requests, data):
    events = interleaved(data, requests)
    _check(requests, events, as_json=False, columnar=True)
    _check(requests, events, as_json=True, columnar=False)
