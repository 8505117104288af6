"""What each vLLM message (the text after a line's envelope) adds: request lines to their
request's record (:class:`~pipeline.ingest.vllm.requests.RequestJoins`), stats lines as
engine-metrics rows; a cut or mangled line is a reject, any other line counted as ignored."""

from __future__ import annotations

from typing import Any

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.vllm.envelope import (
    CUT_OFF,
    OTHER_LINE,
    REQUEST_KEYWORDS,
    TOKENIZER_LINES,
    cut_keyword,
)
from pipeline.ingest.vllm.fields import stats_values, v0_prefix_rates, whole_stats
from pipeline.ingest.vllm.request_lines import (
    FINISHED_OK,
    NO_PROMPT,
    ReceivedReader,
    details_values,
    generated_values,
    whole_value,
)
from pipeline.ingest.vllm.requests import RequestJoins, settle

#: what reading a mangled value may raise (a prompt literal read by Python's rules included)
_BAD_VALUE = (ValueError, SyntaxError, MemoryError, RecursionError)
_BAD_GENERATED = "malformed Generated response line"


class VllmMessages:
    """Reads the messages of one piece's lines into ``joins`` and ``result``'s metrics;
    ``instance`` names the file (metrics rows)."""

    def __init__(self, result: ChunkResult, joins: RequestJoins, instance: str) -> None:
        self.out = result
        self.joins = joins
        self.instance = instance
        self._received_reader = ReceivedReader()

    def message(self, msg: str, level: str, ts: str, line_no: int) -> None:
        """One message, dispatched on its first words."""
        first = msg[:1]
        if first == "R":
            if msg.startswith(TOKENIZER_LINES):  # /tokenize serves no prompt: not a request
                self.out.ignored["tokenizer request line"] += 1
                return None
            if msg.startswith("Received request "):
                return self._received(msg, ts, line_no)
            if msg.startswith("Request "):
                return self._request_line(msg, ts, line_no)
        elif first == "A":
            if msg.startswith("Added request "):
                return self._added(msg, ts, line_no)
            if msg.startswith("Aborted request"):
                return self._aborted(msg, ts, line_no)
            if msg.startswith("Avg prompt throughput"):
                return self._stats(msg, ts, None, line_no)
        elif first == "G" and msg.startswith("Generated response "):
            return self._generated(msg, ts, line_no)
        elif first == "F" and msg.startswith("Finished request "):
            return self._finished(msg, ts, line_no)
        elif first == "E" and msg.startswith("Engine "):
            return self._engine_stats(msg, ts, line_no)
        elif first == "P" and msg.startswith("Prefix cache hit rate: GPU"):
            return self._v0_prefix_rate(msg, ts, line_no)
        elif first.isdigit() and " Engines Aggregated: " in msg:
            return self._engine_stats(msg, ts, line_no)
        if cut_keyword(msg):
            self.out.rejects.add(CUT_OFF, line_no, msg)
            return None
        kind = "error line" if level in ("ERROR", "CRITICAL") else OTHER_LINE
        self.out.ignored[kind] += 1
        return None

    # --- request lines --------------------------------------------------------------------

    def _received(self, msg: str, ts: str, line_no: int) -> None:
        colon = msg.find(": ", 17)
        if colon < 0 or not msg.endswith("."):
            self.out.rejects.add("malformed Received request line", line_no, msg)
            return
        request_id = msg[17:colon]
        try:  # read every field before touching the joins: a bad line changes nothing
            read = self._received_reader.read(msg, colon + 2, len(msg) - 1)
        except _BAD_VALUE as exc:
            self.out.rejects.add(
                f"malformed Received request line: {type(exc).__name__}", line_no, msg
            )
            return
        prompt, (fields, ids), id_count = read
        joins = self.joins
        record = joins.new_head(request_id, ts, line_no)
        if prompt is not NO_PROMPT:
            joins.set_prompt(record, prompt)
        record.update(fields)
        if id_count is None:
            joins.set_ids(record, ids)
        else:
            joins.set_id_count(record, id_count)

    def _request_line(self, msg: str, ts: str, line_no: int) -> None:
        """``Request <id> details: ...`` (DEBUG prompt) and ``Request <id> aborted./failed``."""
        space = msg.find(" ", 8)
        request_id, rest = msg[8:space], msg[space + 1 :]
        known = space >= 0 and rest.startswith(REQUEST_KEYWORDS)
        if (known and not msg.endswith(".")) or space < 0 or cut_keyword(rest, REQUEST_KEYWORDS):
            self.out.rejects.add(CUT_OFF, line_no, msg)  # these end with "." (FORMATS.md 1.6)
            return None
        if not known:  # "Request <id> JSON body: ..." (DEBUG, 0.32) and others
            self.out.ignored[OTHER_LINE] += 1
            return None
        if rest.startswith("details: prompt: "):
            return self._details(request_id, rest[17:], ts, line_no)
        if rest.startswith("aborted"):
            return self.joins.set_status(request_id, "aborted", ts, line_no)
        if rest.startswith("failed"):
            bad = rest.startswith(("failed (bad request)", "failed (input error)"))
            return self.joins.set_status(request_id, "rejected" if bad else "failed", ts, line_no)
        return None

    def _details(self, request_id: str, rest: str, ts: str, line_no: int) -> None:
        try:
            prompt, ids = details_values(rest)
        except _BAD_VALUE as exc:
            self.out.rejects.add(
                f"malformed Request details line: {type(exc).__name__}", line_no, rest
            )
            return
        record = self.joins.record(request_id, ts, line_no)
        self.joins.set_prompt(record, prompt)
        self.joins.set_ids(record, ids)

    def _added(self, msg: str, ts: str, line_no: int) -> None:
        if not msg.endswith(".") or len(msg) < 16:
            self.out.rejects.add(CUT_OFF, line_no, msg)
            return
        request_id = msg[14:-1]
        if request_id not in self.joins.requests:  # else known: nothing to add
            self.joins.record(self.joins.engine_id(request_id), ts, line_no)

    def _finished(self, msg: str, ts: str, line_no: int) -> None:
        if not msg.endswith(".") or len(msg) < 19:
            self.out.rejects.add(CUT_OFF, line_no, msg)
            return
        self.joins.set_status(self.joins.engine_id(msg[17:-1]), "ok", ts, line_no)

    def _aborted(self, msg: str, ts: str, line_no: int) -> None:
        if not msg.endswith("."):
            self.out.rejects.add(CUT_OFF, line_no, msg)
            return
        ids = msg.split(" ", 2)[-1][:-1]
        for request_id in ids.split(","):
            if request_id:
                engine_id = self.joins.engine_id(request_id.strip())
                self.joins.set_status(engine_id, "aborted", ts, line_no)

    def _generated(self, msg: str, ts: str, line_no: int) -> None:
        colon = msg.find(": output: ")
        if colon < 0:
            if " details: output_token_ids: " in msg:
                return self._generated_details(msg, ts, line_no)
            self.out.rejects.add(_BAD_GENERATED, line_no, msg)
            return None
        values = generated_values(msg, colon)
        if values is None:
            self.out.rejects.add(_BAD_GENERATED, line_no, msg)
            return None
        request_id, mode, ids, reason = values
        record = self.joins.record(request_id, ts, line_no)
        self.joins.count_output(record, mode, ids)
        if reason in FINISHED_OK:
            settle(record, "ok")
        return None

    def _generated_details(self, msg: str, ts: str, line_no: int) -> None:
        ids = msg[msg.find(" details: output_token_ids: ") + 28 :]
        if not whole_value(ids) or ids == "None":
            self.out.rejects.add(_BAD_GENERATED, line_no, msg)
            return
        request_id, _, mode = msg[19 : msg.find(" details: ")].partition(" ")
        self.joins.count_output(self.joins.record(request_id, ts, line_no), mode, ids)

    # --- stats lines ----------------------------------------------------------------------

    def _engine_stats(self, msg: str, ts: str, line_no: int) -> None:
        head, _, rest = msg.partition(": ")
        if rest.startswith("Avg prompt"):
            self._stats(rest, ts, head, line_no)
        else:
            self.out.ignored[OTHER_LINE] += 1

    def _stats(self, msg: str, ts: str, engine: str | None, line_no: int) -> None:
        if not whole_stats(msg):
            self.out.rejects.add("malformed stats line", line_no, msg)
            return
        row: dict[str, Any] = {"ts": ts, "source": "vllm", "instance": self._instance(engine),
                               "_line": line_no}  # fmt: skip
        row.update(stats_values(msg))
        self.out.metrics.append(row)

    def _v0_prefix_rate(self, msg: str, ts: str, line_no: int) -> None:
        rates = v0_prefix_rates(msg)
        if rates is None:
            self.out.ignored[OTHER_LINE] += 1
            return
        last = self.out.metrics[-1] if self.out.metrics else None
        if last is not None and last["ts"] == ts and "prefix_cache_hit_rate" not in last:
            last.update(rates)
            return
        self.out.metrics.append(
            {"ts": ts, "source": "vllm", "instance": self.instance, "_line": line_no, **rates}
        )

    def _instance(self, engine: str | None) -> str:
        return f"{self.instance}/{engine}" if engine else self.instance
