"""Hugging Face TGI router logs, v1 to v3, text and ``--json-output`` (FORMATS.md section 2).

Text events start with ``<RFC 3339 µs timestamp> <LEVEL> ``; any other line continues the
previous event's message (DEBUG ``Input:`` of a chat template spans lines). After the level
come the spans (``name{fields}:`` ... root first), a space, ``target: file.rs:line: `` and the
message. A small scanner walks the spans (braces counted, ``"..."`` strings skipped), because
span fields contain ``: `` and ``{}``.

Records: every ``Success`` event (``ts`` = event time − ``total_time``, i.e. arrival; timings
from the span; ``output_tokens`` = ``inference_time / time_per_token``), and every error event
of a request (validation -> ``rejected``, ``no permits available`` -> ``overloaded``,
generation failures and incomplete generations -> ``failed``). TGI logs no request id.
DEBUG ``Input:`` events are joined to the next ``Success`` with the same handler span and
parameters, first in first out (TGI gives nothing better to join on).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.columnar import TIME_LOW, router_times, tgi_success_rows
from pipeline.ingest.hashing import PrefixHasher
from pipeline.ingest.lines import DEFAULT_MAX_LINE_BYTES
from pipeline.ingest.reprs import (
    INT64,
    NOT_TEXT,
    NotACharacterError,
    as_count,
    as_float,
    as_int,
    check_text,
    decode_rust_str,
    generate_parameters,
    params_hash,
    rust_option,
    seed_u64,
)
from pipeline.ingest.vllm import ANSI

EVENT_START = re.compile(
    r"(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) +(?P<level>TRACE|DEBUG|INFO|WARN|ERROR) "
)
_SPAN_NAME = re.compile(r"([A-Za-z_][\w ]*?)(\{|:(?!:))")
_BRACES = re.compile(r"\"(?:[^\"\\]|\\.)*\"|[{}]", re.DOTALL)
_FIELD_SPLIT = re.compile(r"\"(?:[^\"\\]|\\.)*\"|[{}\[\]()]| (?=[\w.]+=)", re.DOTALL)
_TARGET = re.compile(r"(?P<target>[\w:]+): (?P<file>[\w/.-]+\.rs):(?P<line>\d+): ")
#: duration units before ``s``: (characters, seconds)
_TWO_LETTER_UNITS = {"ns": (2, 1e-9), "µs": (2, 1e-6), "us": (2, 1e-6), "ms": (2, 1e-3)}
_INPUTS = re.compile(r"inputs: (\"(?:[^\"\\]|\\.)*\")", re.DOTALL)
ENDPOINTS = {
    "chat_completions": "/v1/chat/completions",
    "completions": "/v1/completions",
    "compat_generate": "/",
    "generate": "/generate",
    "generate_stream": "/generate_stream",
}
_OPENERS = ("{", "[", "(")
_CLOSERS = ("}", "]", ")")
#: parameters texts remembered: decoded (least recently used dropped) and parsed into fields
#: (a parser's full table dropped)
_PARAMS_CACHE_SIZE = 4096
#: messages printed raw, so they may hold newlines
_MULTILINE = ("Input: ", "Output: ", "Request failed during generation", "Server error")
#: an ``Input:`` is logged right after the request's clock starts, a ``Success`` right after
#: ``total_time`` is read: the two instants agree within microseconds; 20 ms covers clock
#: granularity and a loaded host without reaching a neighbour more often than a FIFO would
INPUT_JOIN_S = 0.02
#: launcher and shard-manager lines: a target (``text_generation_launcher: ``) or a span
#: name first, no ``file.rs:line``
_LAUNCHER = re.compile(r"[a-z_][\w-]*(?:::[\w-]+)*(?:\{[^{}]*\})?: ")
#: validation errors that print the prompt's length (and the requested max_new_tokens)
_GIVEN_TOTAL = re.compile(
    r"`inputs` tokens \+ `max_new_tokens` must be <= \d+\. Given: (\d+) `inputs` tokens and "
    r"(\d+) `max_new_tokens`$"
)
_GIVEN_INPUT = re.compile(r"`inputs` must have less than \d+ tokens\. Given: (\d+)$")
_GIVEN_MAX_NEW = re.compile(r"`max_new_tokens` must be <= \d+\. Given: (\d+)$")
BLANK = "blank line"
#: non-streaming ``Input:`` is cut to 1000 characters (v2.3+) or bytes (v2.0-2.2)
INPUT_LOG_CAP = 1000


@dataclass
class TgiEvent:
    """One log event: header, spans (root first) and the message."""

    ts: str
    level: str
    spans: list[tuple[str, dict[str, str]]]
    target: str
    message: str
    line: int
    continuation: list[str] = field(default_factory=list)
    #: JSON events logged with an explicit parent outside any entered span (streaming)
    detached: bool = False
    #: characters of the message so far; lines of a message over the cap are rejected
    size: int = 0
    overflow: bool = False

    def takes_continuation(self) -> bool:
        """Whether lines without a timestamp may continue this event's message: only texts
        TGI prints raw (a prompt, a generated text, a Python exception); every other event is
        one line, so a line after it is garbage, never part of it."""
        return not self.overflow and self.message.startswith(_MULTILINE)

    def text(self) -> str:
        """The whole message, continuation lines included."""
        if not self.continuation:
            return self.message
        return "\n".join([self.message, *self.continuation])


def duration_s(text: str | None) -> float | None:
    """Rust ``Duration`` Debug text (``754.5µs``, ``1.5s``) in seconds."""
    if not text:
        return None
    if text[0] == '"' or text[-1] == '"':
        text = text.strip('"')
    # ``(\d+(?:\.\d+)?)(ns|µs|us|ms|s)`` read by string methods, 2x faster (4 a request):
    # ``isdecimal`` is ``\d`` (Unicode category Nd), which ``float`` reads too
    unit = _TWO_LETTER_UNITS.get(text[-2:])
    if unit is None:
        if text[-1:] != "s":
            return None
        unit = (1, 1.0)
    number = text[: -unit[0]]
    if not number.replace(".", "", 1).isdecimal() or number[0] == "." or number[-1] == ".":
        return None
    return float(number) * unit[1]


def span_fields(text: str) -> dict[str, str]:
    """``key=value key="value" ...`` of one span; quoted values decoded, raw ones kept."""
    parts, depth, start = [], 0, 0
    for match in _FIELD_SPLIT.finditer(text):
        token = match.group()
        if token == " ":
            if depth == 0:
                parts.append(text[start : match.start()])
                start = match.end()
        elif token in _OPENERS:
            depth += 1
        elif token in _CLOSERS:
            depth = max(0, depth - 1)
    parts.append(text[start:])
    return _field_values(parts)


def _field_values(parts: list[str]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in parts:
        key, found, value = part.strip().partition("=")
        if found:
            fields[key] = decode_rust_str(value) if value.startswith('"') else value
    return fields


#: the usual shape of a request event, read in one match: ``handler{[parameters=...]
#: key="value"...}[:child...]: target: file.rs:line: `` (quoted or raw ``GenerateParameters``)
_FAST_SPAN = re.compile(
    r"(?P<span>\w+)\{(?:parameters="
    r"(?P<params>\"[^\"\\]*(?:\\.[^\"\\]*)*\"|GenerateParameters \{[^{}]*\})(?= |\}))?"
    r"(?P<fields>(?: ?\w+=\"[^\"\\]*\")*)\}(?P<children>(?::\w+)*): "
    r"(?P<target>[\w:]+): [\w/.-]+\.rs:\d+: "
)
_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_QUOTED_FIELD = re.compile(r"(\w+)=\"([^\"\\]*)\"")


@functools.lru_cache(maxsize=_PARAMS_CACHE_SIZE)
def _printed_parameters(params: str) -> str:
    """A span's parameters as printed, decoded (memoised: clients repeat them)."""
    return decode_rust_str(params) if params.startswith('"') else params


def _fast_spans(match: re.Match[str]) -> list[tuple[str, dict[str, str]]]:
    """Spans of a fast match."""
    fields = dict(_QUOTED_FIELD.findall(match.group("fields")))
    params = match.group("params")
    if params is not None:
        fields["parameters"] = _printed_parameters(params)
    spans = [(match.group("span"), fields)]
    children = match.group("children")
    if children:
        spans.extend((name, {}) for name in children[1:].split(":"))
    return spans


def _matching_brace(text: str, pos: int) -> int:
    """Index just past the ``}`` closing the ``{`` at ``text[pos]``; -1 if unbalanced."""
    depth = 0
    for match in _BRACES.finditer(text, pos):
        token = match.group()
        if token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            if depth == 0:
                return match.end()
    return -1


def parse_spans(rest: str) -> tuple[list[tuple[str, dict[str, str]]], int]:
    """Spans at the start of ``rest`` (root first) and the offset of what follows them."""
    spans: list[tuple[str, dict[str, str]]] = []
    pos = 0
    while True:
        match = _SPAN_NAME.match(rest, pos)
        if match is None:
            return spans, pos
        if match.group(2) == "{":
            close = _matching_brace(rest, match.end() - 1)
            if close < 0 or rest[close : close + 1] != ":":
                return spans, pos
            spans.append((match.group(1), span_fields(rest[match.end() : close - 1])))
            pos = close + 1
        else:
            spans.append((match.group(1), {}))
            pos = match.end()
        if rest[pos : pos + 1] == " ":
            return spans, pos + 1


def parameter_fields(values: dict[str, str]) -> dict[str, Any]:
    """Record fields from the fields of a ``GenerateParameters`` Debug text."""
    record: dict[str, Any] = {}
    plain = {k: rust_option(v) for k, v in values.items()}
    record["temperature"] = as_float(plain.get("temperature"))
    record["top_p"] = as_float(plain.get("top_p"))
    record["top_k"] = as_int(plain.get("top_k"))
    record["max_tokens"] = as_int(plain.get("max_new_tokens"))
    record["seed"] = seed_u64(plain.get("seed"))
    adapter = plain.get("adapter_id")
    if adapter is not None:
        record["adapter"] = decode_rust_str(adapter)
    plain["max_tokens"] = plain.get("max_new_tokens")
    plain["structured_outputs"] = plain.get("grammar")
    record["params_hash"] = params_hash(plain)
    return record


class TgiChunkParser:
    """Parse text or JSON TGI lines of one chunk into record heads."""

    def __init__(
        self,
        result: ChunkResult,
        block_size: int,
        json_lines: bool,
        *,
        max_message: int = DEFAULT_MAX_LINE_BYTES,
        columnar: bool = True,
    ) -> None:
        self.out = result
        self.block_size = block_size
        self.json_lines = json_lines
        self.max_message = max_message
        #: read plain ``Success`` lines column-wise (False: every line by the Python path)
        self.columnar = columnar
        self.current: TgiEvent | None = None
        #: ``Input:`` events not joined yet, per handler and parameters: (time, text, line)
        self.inputs: dict[tuple[str, str | None], list[tuple[float, str, bool]]] = {}
        self._params_cache: dict[str, dict[str, Any]] = {}
        self._hasher = PrefixHasher(block_size)

    def feed(self, first_line: int, lines: Sequence[str]) -> None:
        """Parse a block of lines numbered from ``first_line``: plain ``Success`` events
        column-wise, every other line (and a ``Success`` an ``Input:`` may join) one by one."""
        if self.json_lines or not self.columnar:
            for line_no, line in enumerate(lines, first_line):
                self._json_line(line, line_no) if self.json_lines else self._text_line(
                    line, line_no
                )
            return
        fast, frame = tgi_success_rows(
            lines, _printed_parameters, self._parameter_fields, ENDPOINTS
        )
        taken = np.zeros(len(lines), dtype=bool)
        start = 0
        for stop in [*np.flatnonzero(~fast).tolist(), len(lines)]:
            self._read_run(lines, first_line, start, stop, taken)
            if stop < len(lines):
                self._text_line(lines[stop], first_line + stop)
            start = stop + 1
        if frame is not None and taken.any():
            read = frame[taken[frame["_line"].to_numpy()]].reset_index(drop=True)
            read["_line"] = read["_line"] + first_line
            self.out.head_frames.append(read)

    def _read_run(
        self, lines: Sequence[str], first_line: int, start: int, stop: int, taken: np.ndarray
    ) -> None:
        """Lines ``start .. stop-1``, plain ``Success`` lines read column-wise: taken as read,
        but while an ``Input:`` is pending each goes by the per-line path (it may join it)."""
        i = start
        while i < stop:
            if self.current is not None:
                self._flush()  # an event still open may be an ``Input:`` this line joins
            if not self.inputs:
                taken[i:stop] = True
                return
            self._text_line(lines[i], first_line + i)
            i += 1

    # --- text -------------------------------------------------------------------------------

    def _text_line(self, line: str, line_no: int) -> None:
        if "\x1b" in line:
            line = ANSI.sub("", line)
        start = EVENT_START.match(line)
        if start is None:
            return self._stray_line(line, line_no)
        self._flush()
        try:
            self._event_line(start, line, line_no)
        except NotACharacterError:  # a span's field escapes no character: the line is bad
            self.out.rejects.add(NOT_TEXT, line_no, line)
        return None

    def _event_line(self, start: re.Match[str], line: str, line_no: int) -> None:
        """A line that starts an event (``start``: its time and level): its spans, target and
        message."""
        rest = line[start.end() :].removesuffix("\r")
        fast = _FAST_SPAN.match(rest)
        if fast is not None:
            spans = _fast_spans(fast)
            self._start_event(start, spans, fast.group("target"), rest[fast.end() :], line_no)
            return None
        spans, pos = parse_spans(rest)
        target = _TARGET.match(rest, pos)
        if target is None and spans:  # a target without '::' was read as a span name
            target = _TARGET.search(rest, pos - len(spans[-1][0]) - 2)
            spans = spans[:-1]
        if target is not None:
            self._start_event(start, spans, target.group("target"), rest[target.end() :], line_no)
        elif _LAUNCHER.match(rest) and not _router_line(rest):
            self.out.ignored["launcher or other line"] += 1
        else:  # a router event always names its file: this one was cut or mangled
            self.out.rejects.add("malformed TGI event line", line_no, line)
        return None

    def _start_event(
        self, start: re.Match[str], spans: list[tuple[str, dict[str, str]]], target: str,
        message: str, line_no: int,
    ) -> None:  # fmt: skip
        if len(message) < 7 and "Success".startswith(message):
            self.out.rejects.add("cut-off line", line_no, message)  # "Succ": cut short
            return
        self.current = TgiEvent(start.group("ts"), start.group("level"), spans, target,
                                message, line_no, size=len(message))  # fmt: skip

    def _stray_line(self, line: str, line_no: int) -> None:
        """A line without a timestamp: the next line of a multi-line message, or garbage that
        costs itself only (counted once, the event before it untouched)."""
        event = self.current
        if event is not None and event.takes_continuation() and "\ufffd" not in line:
            event.size += len(line) + 1
            if event.size <= self.max_message:
                event.continuation.append(line.removesuffix("\r"))
                return
            # over the cap: the whole message is rejected, line by line, and not held
            event.overflow = True
            self.out.rejects.add("message too long", event.line, event.message,
                                 n=1 + len(event.continuation))  # fmt: skip
            event.continuation.clear()
        if event is not None and event.overflow:
            self.out.rejects.add("message too long", line_no, line)
        elif not line.strip():
            self.out.rejects.add(BLANK, line_no, line)
        else:
            self.out.rejects.add(self._reason(line), line_no, line)

    @staticmethod
    def _reason(line: str) -> str:
        return "invalid utf-8" if "\ufffd" in line else "not a TGI log line"

    # --- json -------------------------------------------------------------------------------

    def _json_line(self, line: str, line_no: int) -> None:
        if not line.strip():
            self.out.rejects.add(BLANK, line_no, line)
            return
        try:
            obj = json.loads(line)
            event = self._json_event(obj, line_no)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            reason = self._reason(line) if not line.startswith("{") else "bad JSON event"
            self.out.rejects.add(f"{reason}: {type(exc).__name__}", line_no, line)
            return
        if event is None:
            self.out.ignored["launcher or other line"] += 1
            return
        self._event(event)

    @staticmethod
    def _json_event(obj: Any, line_no: int) -> TgiEvent | None:
        if not isinstance(obj, dict):
            raise TypeError("not a JSON object")
        if "message" not in obj or "filename" not in obj:
            return None  # launcher lines keep their fields nested; nothing per request
        spans = [(s["name"], s) for s in obj.get("spans", [])]
        leaf = obj.get("span")
        if leaf is not None and all(f is not leaf and f != leaf for _, f in spans):
            spans.append((leaf["name"], leaf))  # an explicit parent outside the entered scope
        event = TgiEvent(str(obj["timestamp"]), str(obj["level"]), spans,
                         str(obj.get("target", "")), str(obj["message"]), line_no)  # fmt: skip
        event.detached = obj.get("spans") == [] and "span" in obj
        return event

    # --- events -----------------------------------------------------------------------------

    def _flush(self) -> None:
        if self.current is not None:
            event, self.current = self.current, None
            if not event.overflow:
                self._event(event)

    def _event(self, event: TgiEvent) -> None:
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
        kind = "output/token debug line" if message.startswith(("Output: ", "Token: ")) else None
        self.out.ignored[kind or "other TGI line"] += 1
        return None

    def _handler(self, event: TgiEvent) -> tuple[str | None, dict[str, str]]:
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

    def _input(self, event: TgiEvent, text: str) -> None:
        check_text((text,))
        handler, fields = self._handler(event)
        key = (handler or "", fields.get("parameters"))
        at = _seconds(event.ts)
        if at is None:
            self.out.ignored["input debug line (no time)"] += 1
            return
        self.inputs.setdefault(key, []).append((at, text, self._streaming(event)))

    def _success(self, event: TgiEvent) -> None:
        handler, fields = self._handler(event)
        record = self._base(event, handler, fields, "ok")
        total = duration_s(fields.get("total_time"))
        record["e2e_s"] = total
        record["queue_s"] = duration_s(fields.get("queue_time"))
        record["_ts_minus_s"] = total or 0.0
        inference = duration_s(fields.get("inference_time"))
        per_token = duration_s(fields.get("time_per_token"))
        if inference is not None and per_token:
            record["output_tokens"] = as_count(inference / per_token)
        pending = self.inputs.get((handler or "", fields.get("parameters")))
        if pending and total is not None:
            joined = _closest_input(pending, _seconds(event.ts), total)
            if joined is not None:
                self.out.ignored["input debug line (joined)"] += 1
                self._set_prompt(record, joined[1], streaming=joined[2] or self._streaming(event))
        self.out.heads.append(record)

    def _error(self, event: TgiEvent, message: str) -> None:
        target = event.target
        if message == "no permits available":
            status = "overloaded"
        elif message.startswith(("Request failed during generation", "Incomplete generation")):
            status = "failed"
        elif target.endswith("::infer") or "is not supported when streaming" in message:
            status = "rejected"
        else:
            self.out.ignored["error line (not a request outcome)"] += 1
            return
        handler, fields = self._handler(event)
        record = self._base(event, handler, fields, status)
        record["_ts_minus_s"] = 0.0
        if status == "rejected":
            record.update(given_counts(message))
        self.out.heads.append(record)

    def _base(
        self, event: TgiEvent, handler: str | None, fields: dict[str, str], status: str
    ) -> dict[str, Any]:
        record: dict[str, Any] = {"ts": event.ts, "request_id": fields.get("_trace_id"),
                                  "status": status, "_line": event.line}  # fmt: skip
        record["endpoint"] = fields.get("_route") or ENDPOINTS.get(handler or "")
        params_text = fields.get("parameters")
        request = fields.get("request")
        if request is not None:  # v1.1 and older: the infer span prints the whole request
            params_text = params_text or request[request.find("parameters: ") + 12 :]
            inputs = _INPUTS.search(request)
            if inputs is not None:
                self._set_prompt(record, decode_rust_str(inputs.group(1)), streaming=True)
        if params_text:
            self._params(record, params_text)
        seed = rust_option(fields.get("seed"))
        if seed is not None:
            record["seed"] = seed_u64(seed)
        check_text(record.values())
        return record

    def _params(self, record: dict[str, Any], text: str) -> None:
        record.update(self._parameter_fields(text))

    def _parameter_fields(self, text: str) -> dict[str, Any]:
        fields = self._params_cache.get(text)
        if fields is None:
            if len(self._params_cache) >= _PARAMS_CACHE_SIZE:
                self._params_cache.clear()
            fields = self._params_cache[text] = parameter_fields(generate_parameters(text))
        return fields

    @staticmethod
    def _streaming(event: TgiEvent) -> bool:
        """Known streaming: ``/generate_stream``, or a JSON event with a detached span."""
        return event.detached or bool(event.spans and event.spans[0][0] == "generate_stream")

    def _set_prompt(self, record: dict[str, Any], prompt: str, streaming: bool) -> None:
        check_text((prompt,))  # (before it is hashed)
        cut = not streaming and (
            len(prompt) == INPUT_LOG_CAP or 997 <= len(prompt.encode()) <= INPUT_LOG_CAP
        )
        record["prompt"] = prompt
        record["prompt_truncated"] = cut
        hashes = self._hasher.hashes(prompt)
        record["prefix_hashes"] = hashes[:-1] if cut else hashes

    def finish(self) -> ChunkResult:
        """Flush the last event; count the ``Input:`` events no ``Success`` took."""
        self._flush()
        left = sum(len(pending) for pending in self.inputs.values())
        if left:
            self.out.ignored["input debug line (no Success near its time)"] += left
        return self.out


def _router_line(rest: str) -> bool:
    """Whether an event comes from the router (its handler spans or target), which always
    prints ``file.rs:line``: without them the line was cut."""
    name = re.match(r"[\w ]+", rest)
    return "text_generation_router" in rest or (
        name is not None and (name.group() in ENDPOINTS or name.group() == "HTTP request")
    )


#: a total time past this is junk (a Rust ``Duration`` prints up to ~1.8e19 s): the request's
#: arrival is unknown, not a time centuries back (which no timestamp can hold)
_LONGEST_TOTAL_S = 100 * 365.25 * 86400


def arrival_ts(frame: pd.DataFrame) -> pd.Series:
    """Event time (UTC, µs) minus the request's total time: the arrival time (``NaT`` for a
    total time past :data:`_LONGEST_TOTAL_S`)."""
    ts = _event_times(frame["ts"])
    seconds = frame["_ts_minus_s"].fillna(0.0).astype(float)
    known = seconds.abs() <= _LONGEST_TOTAL_S
    back = pd.to_timedelta(seconds.where(known, 0.0), unit="s")
    return (ts - back).where(known).astype("datetime64[us, UTC]")


def _event_times(ts: pd.Series) -> pd.Series:
    """Event times (RFC 3339 texts) as UTC instants (``NaT`` where unreadable).

    Times of the router's shape are read by Arrow, after numpy checked the shape on the bytes
    (0.01 s instead of 0.046 s for 150,000 times); pandas' ISO 8601 reader, which the others
    go to, gives those the same instants. Arrow refuses a time that is no date or time of day
    (pandas makes it ``NaT``): then all go to pandas."""
    if isinstance(ts.dtype, pd.StringDtype) and len(ts) and not ts.hasnans:
        texts = pa.array(ts.array, pa.string())
        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        if _all_router_times(texts):
            try:
                instants = texts.cast(pa.timestamp("us", "UTC"))
            except pa.ArrowInvalid:
                pass
            else:
                return pd.Series(instants.to_pandas().array, index=ts.index)
    return pd.to_datetime(ts.astype(str), utc=True, format="ISO8601", errors="coerce")


def _all_router_times(texts: pa.StringArray) -> bool:
    """Whether every text has the router's shape (27 characters, :func:`router_times`)."""
    width = len(TIME_LOW)
    offsets = np.frombuffer(texts.buffers()[1], np.int32, len(texts) + 1, texts.offset * 4)
    if np.any(np.diff(offsets) != width):
        return False
    chars = np.frombuffer(texts.buffers()[2], np.uint8)[offsets[0] : offsets[-1]]
    return bool(router_times(chars.reshape(-1, width)).all())


def _seconds(ts: str) -> float | None:
    """An RFC 3339 timestamp as Unix seconds (``None`` when unreadable)."""
    try:
        return datetime.fromisoformat(ts).timestamp()
    except ValueError:
        return None


def _closest_input(
    pending: list[tuple[float, str, bool]], success_at: float | None, total_s: float
) -> tuple[float, str, bool] | None:
    """Take the pending ``Input:`` logged closest to the request's arrival (the ``Success``
    time minus ``total_time``), within :data:`INPUT_JOIN_S`; concurrent requests with the same
    parameters interleave, so first-in-first-out joins the wrong ones."""
    if success_at is None:
        return None
    arrival = success_at - total_s
    best = min(range(len(pending)), key=lambda i: abs(pending[i][0] - arrival))
    if abs(pending[best][0] - arrival) > INPUT_JOIN_S:
        return None
    return pending.pop(best)


def given_counts(message: str) -> dict[str, int]:
    """The prompt length (and requested ``max_new_tokens``) a validation error prints (a
    number past 64 bits is left out)."""
    found = _GIVEN_TOTAL.match(message)
    if found is not None:
        counts = {"prompt_tokens": found.group(1), "max_tokens": found.group(2)}
    elif (found := _GIVEN_INPUT.match(message)) is not None:
        counts = {"prompt_tokens": found.group(1)}
    elif (found := _GIVEN_MAX_NEW.match(message)) is not None:
        counts = {"max_tokens": found.group(1)}
    else:
        return {}
    return {key: int(text) for key, text in counts.items() if int(text) in INT64}
