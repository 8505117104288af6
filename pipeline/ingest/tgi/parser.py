"""The line loop of a TGI router log piece, text or ``--json-output``: plain ``Success`` lines
read column-wise (:func:`~pipeline.ingest.columnar.tgi_success_rows`), every other line into an
event (:mod:`.events`; a line without a timestamp continues the previous event's message or is
a reject), each whole event handed to :class:`~pipeline.ingest.tgi.records.TgiRecords`."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import numpy as np

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.columnar import tgi_success_rows
from pipeline.ingest.lines import ANSI, DEFAULT_MAX_LINE_BYTES
from pipeline.ingest.reprs import NOT_TEXT, NotACharacterError
from pipeline.ingest.tgi.events import (
    ENDPOINTS,
    EVENT_START,
    FAST_SPAN,
    LAUNCHER,
    TARGET,
    Span,
    TgiEvent,
    fast_spans,
    json_event,
    parse_spans,
    printed_parameters,
    router_line,
)
from pipeline.ingest.tgi.records import TgiRecords
from pipeline.ingest.tgi.values import ParameterFields

BLANK = "blank line"
_TOO_LONG = "message too long"
_JSON_ERRORS = (ValueError, TypeError, KeyError, AttributeError, RecursionError)


def _reason(line: str) -> str:
    return "invalid utf-8" if "\ufffd" in line else "not a TGI log line"


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
        self.json_lines = json_lines
        self.max_message = max_message
        #: read plain ``Success`` lines column-wise (False: every line by the Python path)
        self.columnar = columnar
        self.current: TgiEvent | None = None
        #: record fields of a printed ``GenerateParameters``, by its text
        self.parameter_fields = ParameterFields()
        self.records = TgiRecords(result, block_size, self.parameter_fields)

    def feed(self, first_line: int, lines: Sequence[str]) -> None:
        """Parse a block of lines numbered from ``first_line``: plain ``Success`` events
        column-wise, every other line (and a ``Success`` an ``Input:`` may join) one by one."""
        if self.json_lines or not self.columnar:
            line_of = self._json_line if self.json_lines else self._text_line
            for line_no, line in enumerate(lines, first_line):
                line_of(line, line_no)
            return
        fast, frame = tgi_success_rows(lines, printed_parameters, self.parameter_fields,
                                       ENDPOINTS)  # fmt: skip
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
            if not self.records.inputs:
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
        fast = FAST_SPAN.match(rest)
        if fast is not None:
            spans = fast_spans(fast)
            self._start_event(start, spans, fast.group("target"), rest[fast.end() :], line_no)
            return None
        spans, pos = parse_spans(rest)
        target = TARGET.match(rest, pos)
        if target is None and spans:  # a target without '::' was read as a span name
            target = TARGET.search(rest, pos - len(spans[-1][0]) - 2)
            spans = spans[:-1]
        if target is not None:
            self._start_event(start, spans, target.group("target"), rest[target.end() :], line_no)
        elif LAUNCHER.match(rest) and not router_line(rest):
            self.out.ignored["launcher or other line"] += 1
        else:  # a router event always names its file: this one was cut or mangled
            self.out.rejects.add("malformed TGI event line", line_no, line)
        return None

    def _start_event(
        self, start: re.Match[str], spans: list[Span], target: str, message: str, line_no: int
    ) -> None:
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
            self.out.rejects.add(_TOO_LONG, event.line, event.message,
                                 n=1 + len(event.continuation))  # fmt: skip
            event.continuation.clear()
        if event is not None and event.overflow:
            self.out.rejects.add(_TOO_LONG, line_no, line)
        elif not line.strip():
            self.out.rejects.add(BLANK, line_no, line)
        else:
            self.out.rejects.add(_reason(line), line_no, line)

    # --- json -------------------------------------------------------------------------------

    def _json_line(self, line: str, line_no: int) -> None:
        if not line.strip():
            self.out.rejects.add(BLANK, line_no, line)
            return
        try:
            event = json_event(json.loads(line), line_no)
        except _JSON_ERRORS as exc:
            reason = _reason(line) if not line.startswith("{") else "bad JSON event"
            self.out.rejects.add(f"{reason}: {type(exc).__name__}", line_no, line)
            return
        if event is None:
            self.out.ignored["launcher or other line"] += 1
            return
        self.records.event(event)

    # --- events -----------------------------------------------------------------------------

    def _flush(self) -> None:
        if self.current is not None:
            event, self.current = self.current, None
            if not event.overflow:
                self.records.event(event)

    def finish(self) -> ChunkResult:
        """Flush the last event; count the ``Input:`` events no ``Success`` took."""
        self._flush()
        self.records.finish()
        return self.out
