"""Which DEBUG ``Input:`` event is a request's, by what ties them in TGI's own output.

TGI prints no request id and no span id (neither its text nor its JSON layer is set to), so the
ties are these (``router/src/server.rs``, ``generate_internal`` and
``generate_stream_internal``):

- every line of a request is printed inside its handler span (``generate``,
  ``chat_completions`` ...), which shows the fields recorded so far: the ``parameters`` at the
  ``Input:``, the same and the timings (``total_time`` ... ``seed``) at the ``Output:`` and
  the ``Success``; up to v1.0 the HTTP span's ``trace_id`` too;
- per request the order is fixed: ``Input:`` when the request's clock starts (``start_time``),
  then either an error of the request (overloaded, validation, generation, incomplete) or
  ``Output:`` and ``Success``, both right after ``total_time = start_time.elapsed()`` was
  recorded, with the same span fields; concurrent requests interleave in any order;
- an event's time is taken before its line is written: the ``Output:`` time minus
  ``total_time`` is the ``Input:`` time within microseconds on an idle host and within
  :data:`INPUT_LAG_S` under load, while the ``Success`` is stamped after the ``Output:`` line
  was written, which waits for the pipe to the launcher (a generated text, many ``Token:``
  lines of concurrent streams): milliseconds later and more.

Two kinds of line of ``generate_stream_internal`` carry no span, being printed outside the
handler's: the ``Input:`` of a streaming ``/v1/completions`` request, whose prompts the handler
hands to a spawned task (its ``Output:`` and ``Success`` name the ``completions`` span as their
parent), and the stream-only validation errors (`` `best_of` != 1 ``,
`` `decoder_input_details` == true ``), printed as the response body is first polled.

So a ``Success`` joins the pending ``Input:`` of the same handler, parameters (and trace id)
that is closest to its arrival when its ``Output:`` was seen (the ``Output:`` time minus
``total_time``; of two as close, the one printed first), else the latest one stamped before
its arrival as the ``Success`` time gives it (a later one cannot be its, the ``Success`` being
stamped late, never early). An error of a request takes its ``Input:`` where TGI says which it
is: the prompt its v1.1-and-older spans print, or the only ``Input:`` of its handler and
parameters pending that was stamped before the error (for a span-less stream-only error: the
only streamed one whose parameters break the rule it names). Where two could be its, it takes
none: TGI's output does not say which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: how much later than its request's arrival TGI may stamp its ``Input:``. Between
#: ``start_time = Instant::now()`` and the ``Input:``'s stamp the handler does not ``.await``
#: (a counter, the prompt's first 1,000 characters copied, the filter and the formatter's span
#: lookup: microseconds), so the rest is time the OS keeps that thread off its core, which the
#: router's workers share with the tokenizers, the launcher and the Python shards; the arrival
#: the ``Output:`` gives carries the same kind of delay (``total_time`` is taken before six
#: ``span.record`` calls and seven histograms), which only makes the ``Input:`` look earlier.
#: A held-out v3.3.7 log (94 concurrent requests) has ``Input:`` lines 0.50-0.62 ms late: 1 ms
#: takes them with a third to spare, and no more, since two requests of one handler and
#: parameters whose clocks start less than twice this apart may take each other's ``Input:``
INPUT_LAG_S = 0.001
#: printed times are cut to the microsecond: the ``Input:``'s and the ``Output:``'s may each
#: be up to 1 µs early against the ``total_time`` printed to the nanosecond
STAMP_S = 2e-6
#: an ``Input:`` is stamped at most this long after the arrival a ``Success`` (or its
#: ``Output:``) gives
INPUT_AFTER_S = INPUT_LAG_S + STAMP_S
#: a ``Success`` without its ``Output:`` seen gives an arrival late by the ``Output:`` line's
#: write: an ``Input:`` up to this much earlier may be its
INPUT_JOIN_S = 0.02
#: ``Output:`` times held for their ``Success``; past this many (a piece cut between the two,
#: requests dropped by their clients) all are dropped
OUTPUTS_HELD = 4096
#: the span fields TGI records once a request is done: the same on its ``Output:`` and
#: ``Success``, and in practice on no other request's (nanosecond durations)
TIMING_FIELDS = (
    "total_time",
    "validation_time",
    "queue_time",
    "inference_time",
    "time_per_token",
    "seed",
)

#: a request's handler span, its printed parameters and its trace id (v1.0 and older)
RequestKey = tuple[str, str | None, str | None]


@dataclass(frozen=True)
class PendingInput:
    """An ``Input:`` event not joined yet: its time (Unix seconds, and as printed), its text, and
    whether it was streamed (a streamed one is never cut)."""

    at: float
    text: str
    streamed: bool
    ts: str = ""


def request_key(handler: str | None, fields: dict[str, str]) -> RequestKey:
    """What a request's lines share: the handler span, its parameters, its trace id."""
    return handler or "", fields.get("parameters"), fields.get("_trace_id")


def timings_key(key: RequestKey, fields: dict[str, str]) -> tuple[object, ...] | None:
    """What ties an ``Output:`` to its ``Success``: the request's key and its recorded timings
    (``None`` when none are recorded)."""
    timings = tuple(fields.get(name) for name in TIMING_FIELDS)
    return None if timings[0] is None else (key, timings)


class InputJoin:
    """``Input:`` events waiting for their request's outcome, and the ``Output:`` times that
    tell when their request arrived. False when no ``Input:`` waits."""

    def __init__(self) -> None:
        self._inputs: dict[RequestKey, list[PendingInput]] = {}
        self._outputs: dict[tuple[object, ...], float] = {}

    def __bool__(self) -> bool:
        return bool(self._inputs)

    def pending(self) -> int:
        """How many ``Input:`` events wait."""
        return sum(len(waiting) for waiting in self._inputs.values())

    def add_input(self, key: RequestKey, pending: PendingInput) -> None:
        self._inputs.setdefault(key, []).append(pending)

    def add_output(self, key: RequestKey, fields: dict[str, str], at: float | None) -> None:
        """Remember an ``Output:`` time for its ``Success`` (only while an ``Input:`` of its
        request's key waits: no other can be its own, which came before)."""
        tie = timings_key(key, fields)
        if tie is None or at is None or key not in self._inputs:
            return
        if len(self._outputs) >= OUTPUTS_HELD:
            self._outputs.clear()
        self._outputs[tie] = at

    def for_success(
        self, key: RequestKey, fields: dict[str, str], success_at: float | None, total_s: float
    ) -> PendingInput | None:
        """Take the ``Input:`` of the request a ``Success`` ends (see the module's text)."""
        tie = timings_key(key, fields)
        output_at = self._outputs.pop(tie, None) if tie is not None else None
        waiting = self._inputs.get(key)
        if not waiting:
            return None
        if output_at is not None:
            best = _closest(waiting, output_at - total_s)
        elif success_at is not None:
            best = _latest_before(waiting, success_at - total_s)
        else:
            best = None
        return None if best is None else self._take(key, best)

    def for_error(
        self, key: RequestKey, prompt: str | None, error_at: float | None
    ) -> PendingInput | None:
        """Take the ``Input:`` of the request an error ends, where TGI's output says which:
        the one with the prompt its spans print, else the only one of its key waiting that was
        stamped before the error (``None`` where none or two could be its)."""
        waiting = self._inputs.get(key)
        if not waiting:
            return None
        if prompt is not None:  # (the first of that prompt: any is as good)
            found = [i for i, pending in enumerate(waiting) if pending.text == prompt][:1]
        elif error_at is not None:
            found = [i for i, pending in enumerate(waiting) if pending.at <= error_at + STAMP_S]
        else:
            found = []
        return self._take(key, found[0]) if len(found) == 1 else None

    def for_stream_check(
        self, broken_rule: re.Pattern[str], error_at: float | None
    ) -> tuple[RequestKey, PendingInput] | None:
        """Take the ``Input:`` of the request a span-less stream-only validation error ends:
        the only streamed one waiting, stamped before the error, whose parameters break the
        rule the error names (``None`` where none or two could be its)."""
        if error_at is None:
            return None
        found = [
            (key, i)
            for key, waiting in self._inputs.items()
            if key[1] is not None and broken_rule.search(key[1])
            for i, pending in enumerate(waiting)
            if pending.streamed and pending.at <= error_at + STAMP_S
        ]
        if len(found) != 1:
            return None
        key, index = found[0]
        return key, self._take(key, index)

    def _take(self, key: RequestKey, index: int) -> PendingInput:
        waiting = self._inputs[key]
        taken = waiting.pop(index)
        if not waiting:
            del self._inputs[key]
        return taken


def _closest(waiting: list[PendingInput], arrival: float) -> int | None:
    """The ``Input:`` closest to ``arrival`` (within :data:`INPUT_JOIN_S` before and
    :data:`INPUT_AFTER_S` after it)."""
    near = [
        (abs(pending.at - arrival), i)
        for i, pending in enumerate(waiting)
        if arrival - INPUT_JOIN_S <= pending.at <= arrival + INPUT_AFTER_S
    ]
    return min(near)[1] if near else None


def _latest_before(waiting: list[PendingInput], arrival: float) -> int | None:
    """The latest ``Input:`` stamped before ``arrival`` (:data:`INPUT_AFTER_S` allowed after it,
    :data:`INPUT_JOIN_S` before it)."""
    near = [
        (pending.at, i)
        for i, pending in enumerate(waiting)
        if arrival - INPUT_JOIN_S <= pending.at <= arrival + INPUT_AFTER_S
    ]
    return max(near)[1] if near else None
