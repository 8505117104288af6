"""Records from whole TGI events: every ``Success`` event (``ts`` = event time, less
``total_time`` when the times are resolved; timings from the span; ``output_tokens`` =
``inference_time / time_per_token``), and every error event of a request (validation ->
``rejected``, ``no permits available`` -> ``overloaded``, generation failures and incomplete
generations -> ``failed``). TGI logs no request id. DEBUG ``Input:`` events give the prompt
of the ``Success`` or error that ends their request, and an error its arrival (:mod:`.inputs`
says how they are tied). ``seed`` is the seed the client asked for (in the printed
``GenerateParameters``), ``seed_used`` the one the span prints: the server draws one for a
sampling request that asked for none."""

from __future__ import annotations

import re
from typing import Any

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.hashing import PrefixHasher
from pipeline.ingest.reprs import (
    NOT_TEXT,
    NotACharacterError,
    as_count,
    check_text,
    decode_rust_str,
    rust_option,
    seed_u64,
)
from pipeline.ingest.tgi.events import ENDPOINTS, TgiEvent
from pipeline.ingest.tgi.inputs import InputJoin, PendingInput, RequestKey, request_key
from pipeline.ingest.tgi.values import ParameterFields, duration_s, given_counts, seconds

_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_INPUTS = re.compile(r"inputs: (\"(?:[^\"\\]|\\.)*\")", re.DOTALL)
#: non-streaming ``Input:`` is cut to 1000 characters (v2.3+) or bytes (v2.0-2.2)
INPUT_LOG_CAP = 1000
#: the target of the handlers' events (``router/src/server.rs``)
SERVER_TARGET = "text_generation_router::server"
#: the handler whose ``Input:`` TGI prints outside any span: a streaming ``/v1/completions``
#: request (``completions`` runs ``generate_stream_internal`` in a ``tokio::spawn``ed task)
SPANLESS_INPUT_HANDLER = "completions"
#: the stream-only validation errors, printed without a span as the response body is polled
#: (``generate_stream_internal``), and the printed ``GenerateParameters`` that break each
STREAM_CHECKS = {
    "`best_of` != 1 is not supported when streaming tokens": re.compile(r"best_of: Some\((?!1\))"),
    "`decoder_input_details` == true is not supported when streaming tokens": re.compile(
        r"decoder_input_details: true"
    ),
}
#: what ``InferError`` prints before a ``ValidationError``
_VALIDATION_PREFIX = "Input validation error: "

Record = dict[str, Any]


def streaming(event: TgiEvent) -> bool:
    """Known streaming: ``/generate_stream`` (alone, or under ``/``'s or v1.0's HTTP span), or a
    JSON event with a detached span."""
    return event.detached or any(name == "generate_stream" for name, _ in event.spans)


def spanless_input(event: TgiEvent) -> bool:
    """Whether an ``Input:`` event is a streaming ``/v1/completions`` request's, printed
    without a span."""
    return not event.spans and event.target == SERVER_TARGET


def stream_check(event: TgiEvent, message: str) -> re.Pattern[str] | None:
    """The parameters a span-less stream-only validation error says its request sent."""
    if event.spans:
        return None
    return STREAM_CHECKS.get(message.removeprefix(_VALIDATION_PREFIX))


def request_spans(event: TgiEvent) -> tuple[str | None, dict[str, str]]:
    """The handler span's name and the merged fields of the request's spans."""
    handler, merged = None, {}
    for name, fields in event.spans:
        if name in ENDPOINTS and handler is None:
            handler = name
        if name == "HTTP request":  # TGI <= 1.0: the request's route and trace id
            if "http.route" in fields:
                merged["_route"] = fields["http.route"]
            if _TRACE_ID.fullmatch(fields.get("trace_id", "")):
                merged["_trace_id"] = fields["trace_id"]
        merged.update(fields)
    return handler, merged


def error_status(event: TgiEvent, message: str) -> str | None:
    """The request outcome an ERROR event reports (``None``: no request's outcome)."""
    if message == "no permits available":
        return "overloaded"
    if message.startswith(("Request failed during generation", "Incomplete generation")):
        return "failed"
    if event.target.endswith("::infer") or "is not supported when streaming" in message:
        return "rejected"
    return None


class TgiRecords:
    """Turns one piece's whole events into record heads in ``result``; ``Input:`` events wait
    in :attr:`inputs` for the outcome of their request."""

    def __init__(
        self, result: ChunkResult, block_size: int, parameter_fields: ParameterFields
    ) -> None:
        self.out = result
        self.parameter_fields = parameter_fields
        #: ``Input:`` events not joined yet, and ``Output:`` times for their ``Success``
        self.inputs = InputJoin()
        self._hasher = PrefixHasher(block_size)

    def event(self, event: TgiEvent) -> None:
        """One whole event; one whose values hold no valid text (a lone surrogate, escaped
        or from JSON) is a reject, read before anything of it is kept."""
        try:
            self._read_event(event)
        except NotACharacterError:
            self.out.rejects.add(NOT_TEXT, event.line, event.text())

    def _read_event(self, event: TgiEvent) -> None:
        message = event.text()
        if event.level == "INFO" and message == "Success":
            return self._success(event)
        if message.startswith("Input: "):
            return self._input(event, message[7:])
        if event.level == "ERROR":
            return self._error(event, message)
        if message.startswith("Output: ") and self.inputs:
            self._output(event)
        kind = "output/token debug line" if message.startswith(("Output: ", "Token: ")) else None
        self.out.ignored[kind or "other TGI line"] += 1
        return None

    def _input(self, event: TgiEvent, text: str) -> None:
        check_text((text,))
        handler, fields = request_spans(event)
        streamed = streaming(event)
        if spanless_input(event):
            handler, streamed = SPANLESS_INPUT_HANDLER, True
        at = seconds(event.ts)
        if at is None:
            self.out.ignored["input debug line (no time)"] += 1
            return
        pending = PendingInput(at, text, streamed, event.ts)
        self.inputs.add_input(request_key(handler, fields), pending)

    def _output(self, event: TgiEvent) -> None:
        """An ``Output:`` is stamped as its request's timings are recorded: its time tells the
        ``Success`` after it when the request arrived."""
        handler, fields = request_spans(event)
        self.inputs.add_output(request_key(handler, fields), fields, seconds(event.ts))

    def _success(self, event: TgiEvent) -> None:
        handler, fields = request_spans(event)
        record = self._base(event, handler, fields, "ok")
        total = duration_s(fields.get("total_time"))
        record["e2e_s"] = total
        record["queue_s"] = duration_s(fields.get("queue_time"))
        record["_ts_minus_s"] = total or 0.0
        inference = duration_s(fields.get("inference_time"))
        per_token = duration_s(fields.get("time_per_token"))
        if inference is not None and per_token:
            record["output_tokens"] = as_count(inference / per_token)
        if self.inputs and total is not None:
            key = request_key(handler, fields)
            joined = self.inputs.for_success(key, fields, seconds(event.ts), total)
            if joined is not None:
                self.out.ignored["input debug line (joined)"] += 1
                self._set_prompt(record, joined.text, streamed=joined.streamed or streaming(event))
        self.out.heads.append(record)

    def _error(self, event: TgiEvent, message: str) -> None:
        status = error_status(event, message)
        if status is None:
            self.out.ignored["error line (not a request outcome)"] += 1
            return
        handler, fields = request_spans(event)
        record = self._base(event, handler, fields, status)
        record["_ts_minus_s"] = 0.0
        if status == "rejected":
            record.update(given_counts(message))
        if self.inputs:
            joined = self._error_input(event, message, request_key(handler, fields), record)
            if joined is not None:
                self._keep_input(record, *joined)
        self.out.heads.append(record)

    def _error_input(
        self, event: TgiEvent, message: str, key: RequestKey, record: Record
    ) -> tuple[RequestKey, PendingInput] | None:
        """The ``Input:`` of the request an error ends, and its key (:mod:`.inputs`)."""
        at = seconds(event.ts)
        broken_rule = stream_check(event, message)
        if broken_rule is not None:
            return self.inputs.for_stream_check(broken_rule, at)
        pending = self.inputs.for_error(key, record.get("prompt"), at)
        return None if pending is None else (key, pending)

    def _keep_input(self, record: Record, key: RequestKey, pending: PendingInput) -> None:
        """An error record takes its ``Input:``'s arrival and prompt, and the handler and
        parameters of the ``Input:`` where the error prints none (a span-less one)."""
        self.out.ignored["input debug line (joined)"] += 1
        record["ts"] = pending.ts  # the request's clock started then: its arrival
        if record.get("prompt") is None:
            self._set_prompt(record, pending.text, streamed=pending.streamed)
        if record["endpoint"] is None:
            record["endpoint"] = ENDPOINTS.get(key[0])
            if key[1]:
                record.update(self.parameter_fields(key[1]))

    def _base(
        self, event: TgiEvent, handler: str | None, fields: dict[str, str], status: str
    ) -> Record:
        """The fields every record of a request event has: time, id, status, endpoint,
        sampling parameters, the seeds asked for and used (and the prompt, where the span prints
        the request)."""
        record: Record = {"ts": event.ts, "request_id": fields.get("_trace_id"),
                          "status": status, "_line": event.line}  # fmt: skip
        record["endpoint"] = fields.get("_route") or ENDPOINTS.get(handler or "")
        params_text = fields.get("parameters")
        request = fields.get("request")
        if request is not None:  # v1.1 and older: the infer span prints the whole request
            params_text = params_text or request[request.find("parameters: ") + 12 :]
            inputs = _INPUTS.search(request)
            if inputs is not None:
                self._set_prompt(record, decode_rust_str(inputs.group(1)), streamed=True)
        if params_text:
            record.update(self.parameter_fields(params_text))
        seed_used = rust_option(fields.get("seed"))
        if seed_used is not None:
            record["seed_used"] = seed_u64(seed_used)
        check_text(record.values())
        return record

    def _set_prompt(self, record: Record, prompt: str, streamed: bool) -> None:
        check_text((prompt,))  # (before it is hashed)
        cut = not streamed and (
            len(prompt) == INPUT_LOG_CAP or 997 <= len(prompt.encode()) <= INPUT_LOG_CAP
        )
        record["prompt"] = prompt
        record["prompt_truncated"] = cut
        hashes = self._hasher.hashes(prompt)
        record["prefix_hashes"] = hashes[:-1] if cut else hashes

    def finish(self) -> None:
        """Count the ``Input:`` events no ``Success`` took."""
        left = self.inputs.pending()
        if left:
            self.out.ignored["input debug line (no Success near its time)"] += left
