"""The line loop of a vLLM log piece: each line's envelope read (once per distinct text on the
fast path), its message handed to :class:`~pipeline.ingest.vllm.messages.VllmMessages`, its
time tracked (year rollovers), and uvicorn access lines with a 4xx/5xx status kept as failed
records (the only trace of requests rejected before the engine)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.vllm.columnar import served_access_lines
from pipeline.ingest.vllm.envelope import (
    ACCESS_OK_LINE,
    BLANK,
    ENVELOPE,
    FAST_LINE,
    NOT_A_REQUEST_LINE,
    PREFIXED,
    TAG,
    UVICORN,
    UVICORN_OTHER,
    access_status,
    added_known,
    strip_ansi,
)
from pipeline.ingest.vllm.fields import runs_requests
from pipeline.ingest.vllm.messages import VllmMessages
from pipeline.ingest.vllm.request_lines import CACHE_SIZE
from pipeline.ingest.vllm.requests import Record, RequestJoins


class VllmChunkParser:
    """Parse the lines of one chunk of a vLLM log into heads, tails and metrics."""

    def __init__(
        self, result: ChunkResult, block_size: int, instance: str, *, fast_path: bool = True
    ) -> None:
        self.out = result
        #: read the usual envelopes once per distinct text (False: every line by the per-line
        #: path, the reference)
        self.fast_path = fast_path
        self.joins = RequestJoins(result, block_size)
        self.messages = VllmMessages(result, self.joins, instance)
        self.last_ts: str | None = None
        self.pending_access: list[Record] = []
        self.last_month = 0
        #: envelopes by their text (a second's lines of one logger share one)
        self._envelopes: dict[str, tuple[str, str] | tuple[()]] = {}

    # --- the line loop ---------------------------------------------------------------------

    def feed(self, first_line: int, lines: Sequence[str]) -> None:
        """Parse a block of lines numbered from ``first_line``: the access lines of served
        requests are found column-wise (:mod:`~pipeline.ingest.vllm.columnar`) and counted,
        the usual envelope is read once per distinct text (:meth:`_known_envelope`), every
        other line by :meth:`_line`."""
        if not self.fast_path:
            for line_no, line in enumerate(lines, first_line):
                self._line(line, line_no)
            return
        served = served_access_lines(lines)
        self._read_block(lines, [False] * len(lines) if served is None else served.tolist(),
                         first_line)  # fmt: skip

    def _read_block(self, lines: Sequence[str], served: list[bool], first_line: int) -> None:
        """A block's lines in order: the access lines of served requests (``served``) only
        counted, the usual envelope read once per distinct text, every other line by
        :meth:`_line`."""
        envelopes, rejects, access = self._envelopes, self.out.rejects, 0
        requests, message = self.joins.requests, self.messages.message
        for line_no, (line, is_access) in enumerate(zip(lines, served, strict=True), first_line):
            if is_access:
                if not access:  # (the summary lists the kinds as they were met)
                    self.out.ignored[ACCESS_OK_LINE] += 0
                access += 1
                continue
            cut = line.find("] ") + 2
            found = envelopes.get(head := line[:cut]) if cut > 1 else ()
            if found is None:
                found = self._known_envelope(head)
            if not found or line.find("\x1b", cut) >= 0:  # a code after it: the per-line path
                self._line(line, line_no)
                continue
            ts = found[1]
            added = line.startswith("Added request ", cut) and added_known(line, cut, requests)
            if not added:  # (an Added line of a known request adds nothing, rejects nothing)
                msg = line[cut:-1] if line.endswith("\r") else line[cut:]
                rejected = rejects.count
                message(msg, found[0], ts, line_no)
                if rejects.count != rejected:  # a rejected line moves no clock
                    continue
            # (as :meth:`_enveloped`; most lines share the time of the one before)
            if ts != self.last_ts or self.pending_access:
                self._timed(ts, line_no)
        if access:
            self.out.ignored[ACCESS_OK_LINE] += access

    def _known_envelope(self, head: str) -> tuple[str, str] | tuple[()]:
        """Level and time of a line whose text up to its first ``"] "`` is ``head``, when the
        per-line path reads exactly ``head`` as its envelope (empty otherwise: that path reads
        the line). The envelope ends at the first ``]`` after the time (no part of it after the
        time holds one), so every line with this head has this envelope."""
        match = FAST_LINE.match(head) if head else None
        found: tuple[str, str] | tuple[()] = ()
        if match is not None and match.end() == len(head) and match.group(2) is not None:
            found = (match.group(1), match.group(2))
        if len(self._envelopes) >= CACHE_SIZE:
            self._envelopes.clear()
        self._envelopes[head] = found
        return found

    def _line(self, line: str, line_no: int) -> None:
        """One line by the per-line path (the reference for the fast path of :meth:`feed`)."""
        match = FAST_LINE.match(line)
        if match is not None and line.find("\x1b", match.end()) < 0:
            level, ts = match.group(1, 2)
            if ts is None:
                self._access(match, line_no)
                return
            msg = line[match.end() :]
            if msg.endswith("\r"):
                msg = msg[:-1]
        else:
            found = self._envelope(line, line_no)
            if found is None:
                return
            level, ts, msg = found
        self._enveloped(msg, level, ts, line_no)

    def _enveloped(self, msg: str, level: str, ts: str, line_no: int) -> None:
        """A line with an envelope: its message, then its time counts (a rejected line, cut
        or mangled, moves no clock: its year rollover or access-line time would be garbage)."""
        rejected = self.out.rejects.count
        self.messages.message(msg, level, ts, line_no)
        if self.out.rejects.count != rejected:
            return
        self._timed(ts, line_no)

    def _envelope(self, line: str, line_no: int) -> tuple[str, str, str] | None:
        """Level, timestamp and message of a line the fast pattern did not read; ``None``
        when it has no envelope (then it is handled here)."""
        if "\x1b" in line:
            line = strip_ansi(line)
        if line.endswith("\r"):
            line = line[:-1]
        start = 0
        if line.startswith("("):
            tag = TAG.match(line)
            start = tag.end() if tag else 0
        match = ENVELOPE.match(line, start)
        if match is None:
            self._other(line, start, line_no)
            return None
        return match.group("level"), match.group("ts"), line[match.end() :]

    def _other(self, line: str, start: int, line_no: int) -> None:
        """A line without a vLLM envelope at ``start``: blank, uvicorn's, one with a prefix
        before its envelope, or no vLLM line."""
        if not line[start:].strip():
            self.out.rejects.add(BLANK, line_no, line)
            return
        access = UVICORN.match(line, start)
        if access is not None:
            self._access(access, line_no)
            return
        if UVICORN_OTHER.match(line, start):
            self.out.ignored["uvicorn line"] += 1
            return
        prefixed = PREFIXED.match(line, start)
        if prefixed is not None:
            match = ENVELOPE.match(line, prefixed.end())
            if match is not None:
                level, ts = match.group("level", "ts")
                self._enveloped(line[match.end() :], level, ts, line_no)
                return
        reason = "invalid utf-8" if "\ufffd" in line else "not a vLLM log line"
        self.out.rejects.add(reason, line_no, line)

    # --- time -------------------------------------------------------------------------------

    def _timed(self, ts: str, line_no: int) -> None:
        """A good line's time: the year's rollovers, and access lines waiting for a time."""
        if ts != self.last_ts:  # a second's lines share one timestamp: track it once
            self.last_ts = ts
            self._track_year(ts, line_no)
        if self.pending_access:
            for row in self.pending_access:
                row["ts"] = ts
            self.pending_access.clear()

    def _track_year(self, ts: str, line_no: int) -> None:
        """Note where the month falls back by more than half a year: a new year began."""
        if self.out.first_ts is None:
            self.out.first_ts = ts
        self.out.last_ts = ts
        month = int(ts[:2])
        if month < self.last_month - 6:
            self.out.rollovers.append(line_no)
        self.last_month = month

    # --- uvicorn access lines ---------------------------------------------------------------

    def _access(self, match: re.Match[str], line_no: int) -> None:
        """An access line: counted when it served the request (joined by id), else a failed
        record of its own, timed by the line before it (or the next timed one) — unless its
        route runs no request (a router's render or tokenize call, a health probe)."""
        status = int(match.group("status"))
        if status < 400:
            self.out.ignored[ACCESS_OK_LINE] += 1
            return
        endpoint = match.group("path").split("?")[0]
        if not runs_requests(endpoint):
            self.out.ignored[NOT_A_REQUEST_LINE] += 1
            return
        row = {"request_id": None, "ts": self.last_ts, "_line": line_no, "_head": True,
               "endpoint": endpoint, "status": access_status(status)}  # fmt: skip
        if self.last_ts is None:
            self.pending_access.append(row)
        self.out.heads.append(row)

    # --- end of chunk -----------------------------------------------------------------------

    def finish(self) -> ChunkResult:
        """Split joined requests into heads (defining line seen here) and tails."""
        self.joins.split()
        return self.out
