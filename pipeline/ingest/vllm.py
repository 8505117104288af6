"""vLLM logs, v0.4 to current (see ``data/logs/FORMATS.md`` section 1).

One pass over the lines of a chunk: strip ANSI codes, a trailing ``\\r`` and the
``(APIServer pid=N)`` tag; read the envelope (``LEVEL MM-DD HH:MM:SS [file:line] message``,
the ``[`` optional, any ``VLLM_LOGGING_PREFIX`` before the level); dispatch on the start of the
message. Request lines are joined by request id (an engine's ``-xxxxxxxx`` suffix is
stripped); stats lines become engine-metrics rows; uvicorn access lines with a 4xx/5xx status
become failed records (they are the only trace of requests rejected before the engine);
every other line of the envelope is counted as ignored, by kind.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.hashing import PrefixHasher
from pipeline.ingest.reprs import (
    python_str_at,
)
from pipeline.ingest.vllm_columnar import served_access_lines
from pipeline.ingest.vllm_fields import (
    endpoint_of,
    sampling_fields,
    stats_values,
    v0_prefix_rates,
    whole_stats,
)
from pipeline.prefix_blocks import block_hashes_from_ids, count_tokens

ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TAG = re.compile(r"\((?P<proc>[^()]+?) pid=(?P<pid>\d+)\) ")
_ENVELOPE = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<ts>\d\d-\d\d \d\d:\d\d:\d\d) "
    r"\[?[^\]\s]+?:\d+\] "
)
#: the usual lines in one match, colour codes included: codes only where vLLM prints them
#: (around the tag, before the level), none inside the tag, the file name or an access line,
#: so the match reads what ``_strip_ansi`` + ``_TAG`` + ``_ENVELOPE`` (or ``_UVICORN``) read
#: when the rest of the line has no code. Access lines leave the level and time unset.
_FAST_LINE = re.compile(
    r"(?:\x1b\[[0-9;]*m)*(?:\([^()\x1b]+ pid=\d+\)(?:\x1b\[[0-9;]*m)* )?(?:\x1b\[[0-9;]*m)*"
    r"(?:(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d) \[?[^\]\s\x1b]+?:\d+\] "
    r"|[A-Z]+:\s+[^\s\x1b]* - \"[A-Z]+ (?P<path>[^\s\x1b]+) HTTP/[\d.]+\" (?P<status>\d{3}))"
)
_PREFIXED = re.compile(r".{0,64}?(?=(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d )")
_UVICORN = re.compile(
    r"(?P<level>[A-Z]+):\s+(?P<client>\S*) - \"(?P<method>[A-Z]+) (?P<path>\S+) "
    r"HTTP/[\d.]+\" (?P<status>\d{3})"
)
_UVICORN_OTHER = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):\s")
ENGINE_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
_PARAMS = re.compile(r"(?:sampling[ _]params|params): (?P<kind>\w+)\(")
_LORA_NAME = re.compile(r"lora_name='((?:[^'\\]|\\.)*)'")

#: key markers that end a ``Received request`` line, searched from the right
_TAIL_KEYS = (
    ", prompt_adapter_request: ",
    ", lora_request: ",
    ", prompt_embeds shape: ",
    ", prompt_token_ids: ",
    ", prompt token ids: ",
)
_FINISHED_OK = ("stop", "length", "tool_calls", "streaming_complete", "abort")
#: finish reasons vLLM prints (FinishReason, OpenAI's tool_calls, the streaming markers); a
#: line ending in anything else was cut
FINISH_REASONS = frozenset(
    ("stop", "length", "abort", "error", "repetition", "tool_calls", "None", "streaming_complete")
)
#: starts of the messages that carry data: a message that is a proper start of one of them
#: (the empty message included) is a line cut short, not some other logger's line
_DATA_KEYWORDS = (
    "Received request ", "Request ", "Added request ", "Aborted request", "Finished request ",
    "Generated response ", "Avg prompt throughput", "Engine ", "Prefix cache hit rate: GPU",
)  # fmt: skip
#: what follows ``Request <id> `` on the lines that carry data
_REQUEST_KEYWORDS = ("details: prompt: ", "aborted", "failed")
#: request-logger lines of ``/tokenize`` and ``/detokenize`` calls (vLLM 0.32 logs their
#: prompt as it logs a completion's): no request was served, no cache block was used
_TOKENIZER_LINES = (
    "Received request tokenize-", "Request tokenize-",
    "Received request detokenize-", "Request detokenize-",
)  # fmt: skip
BLANK = "blank line"
#: what a served request's access line counts as (the request is joined by its id)
ACCESS_OK_LINE = "access line (joined by id only)"
CUT_OFF = "cut-off line"
#: texts read once are cached, at most this many (repeated parameters, envelopes)
_HASH_CACHE_SIZE = 4096
#: a prompt's prefix hashes until the piece ends and its prompts are hashed together
_HASHED_LATER = object()
#: the longest text after a prompt that is cached (a longer one holds token ids: unique)
_CACHED_REST_CHARS = 2048
#: a ``Received request`` line that prints no prompt (a printed one is a string, or None)
_NO_PROMPT = object()
#: what follows a request line's prompt, read: its record fields and its printed token ids
_Rest = tuple[dict[str, Any], str | None]


def _cut_keyword(msg: str, keywords: tuple[str, ...] = _DATA_KEYWORDS) -> bool:
    """A message that stops inside the first words of a data message (or an empty one:
    nothing after the envelope) is a line cut short; ``keywords``: those first words."""
    return any(len(msg) < len(key) and key.startswith(msg) for key in keywords)


def _added_known(line: str, cut: int, requests: dict[str, Any]) -> bool:
    """Whether ``line``, whose message from ``cut`` starts with ``Added request `` (no colour
    code in it), is a whole ``Added request <id>.`` line of a request already known: such a
    line adds nothing (its time counts), so the loop takes it without cutting its message
    out or dispatching it (a third of its cost; a vLLM INFO log has one per request)."""
    return line.endswith(".") and len(line) - cut >= 16 and line[cut + 14 : -1] in requests


def whole_value(value: str) -> bool:
    """``None``, or a printed list / call whose brackets close (``[1, 2]``, ``X(a=[1])``)."""
    if value == "None":
        return True
    if not value.endswith(("]", ")")):
        return False
    if value[0] == "[" and value.find("[", 1) < 0 and "(" not in value and ")" not in value:
        return value.find("]") == len(value) - 1  # a flat list (``find`` beats ``count`` 10x)
    return value.count("[") == value.count("]") and value.count("(") == value.count(")")


#: what may follow a prompt's token-id list for it to be the list the tail keys find (they
#: are found from the right: a key inside a later value would move it)
_AFTER_IDS = frozenset(
    f"{embeds}{lora}{adapter}"
    for embeds in ("", ", prompt_embeds shape: None")
    for lora in ("", ", lora_request: None")
    for adapter in ("", ", prompt_adapter_request: None")
)
_IDS_KEY = ", prompt_token_ids: ["
#: the tail keys found before the token ids (see :meth:`VllmChunkParser._after_prompt`): one
#: that is printed before the ids but not after them would take them into its value
_KEYS_BEFORE_IDS = _TAIL_KEYS[: _TAIL_KEYS.index(", prompt_token_ids: ")]


def without_token_ids(rest: str) -> tuple[str, int | None]:
    """What follows a prompt with its flat token-id list printed as ``[]`` (requests that
    differ only by their ids then share one read), and the list's count; ``rest`` and None
    when it holds no such list as its last part (read whole then). Both read alike: the list
    is whole either way, holds no key the tail keys could find instead, and no key found
    before it (:data:`_KEYS_BEFORE_IDS`) is printed before it and not after it."""
    at = rest.rfind(_IDS_KEY)
    close = rest.find("]", at) if at >= 0 else -1
    if close < 0 or (after := rest[close + 1 :]) not in _AFTER_IDS:
        return rest, None
    if any(key not in after and rest.find(key, 0, close) >= 0 for key in _KEYS_BEFORE_IDS):
        return rest, None  # (``lora_request: X, prompt_token_ids: [..]``: X's value holds them)
    body = rest[at + len(_IDS_KEY) : close]
    if "[" in body or "(" in body or ")" in body or ":" in body:  # (nested, or a key inside)
        return rest, None
    return f"{rest[:at]}, prompt_token_ids: []{after}", listed_count(body)


def listed_count(body: str) -> int:
    """How many values a printed list's inside holds (``1, 2, 3``: 3; blank: 0), by its commas."""
    return body.count(",") + 1 if body.strip() else 0


def as_token_ids(body: str) -> list[int] | None:
    """The token ids of a printed list's inside (``1, 2, 3``); None when one is no integer."""
    try:
        return [int(x) for x in body.split(",")]
    except ValueError:
        return None


def cut_looking(prompt: str, ids: int) -> bool:
    """Whether a prompt of ``ids`` characters printed with ``ids`` token ids looks cut by
    ``--max-log-len`` (both cut to the same N): its text holds far fewer tokens than that.

    A whole prompt has about one token per pseudo-token (at most one per non-ASCII character
    more, for scripts a tokenizer splits finely), plus a few special tokens; a cut one has one
    token per *character*. Asking for twice the generous estimate plus four keeps short whole
    prompts (``'Hi'``: two ids with BOS) from passing for cut ones.
    """
    if ids == 0:
        return False
    estimate = count_tokens(prompt) + sum(1 for char in prompt if ord(char) > 127)
    return ids >= 2 * estimate + 4


def _settle(record: dict[str, Any], status: str) -> None:
    """Give a request ``status``: an outcome replaces "received" and "ok", "ok" nothing else
    (a request that was aborted, failed or rejected stays so)."""
    if status != "ok" or record.get("status") in (None, "received", "ok"):
        record["status"] = status


def _strip_ansi(line: str) -> str:
    """``line`` without colour codes; only the part up to the last code is rewritten (codes
    colour the envelope, a long message after them is copied once, not scanned again)."""
    last = line.rfind("\x1b")
    end = line.find("m", last) + 1 or last + 1  # a code cannot hold an "m" before its end
    return ANSI.sub("", line[:end]) + line[end:]


class VllmChunkParser:
    """Parse the lines of one chunk of a vLLM log into heads, tails and metrics."""

    def __init__(
        self, result: ChunkResult, block_size: int, instance: str, *, fast_path: bool = True
    ) -> None:
        self.out = result
        #: read the usual envelopes once per distinct text (False: every line by the per-line
        #: path, the reference)
        self.fast_path = fast_path
        self.block_size = block_size
        self.instance = instance
        self.requests: dict[str, dict[str, Any]] = {}
        self.last_ts: str | None = None
        self.pending_access: list[dict[str, Any]] = []
        self.last_month = 0
        self.line_no = 0
        self._hasher = PrefixHasher(block_size)
        #: the records that took a prompt, and the prompt, in log order
        self._prompted: list[tuple[dict[str, Any], str]] = []
        # requests of one client share their sampling parameters: parse each text once
        self._params_cache: dict[str, dict[str, Any]] = {}
        #: what follows a request line's prompt, read, by its text
        self._rest_cache: dict[str, _Rest] = {}
        #: envelopes by their text (a second's lines of one logger share one)
        self._envelopes: dict[str, tuple[str, str] | tuple[()]] = {}

    # --- the line loop ---------------------------------------------------------------------

    def feed(self, first_line: int, lines: Sequence[str]) -> None:
        """Parse a block of lines numbered from ``first_line``: the access lines of served
        requests are found column-wise (:mod:`~pipeline.ingest.vllm_columnar`) and counted,
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
        envelopes, rejects, requests, access = self._envelopes, self.out.rejects, self.requests, 0
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
            self.line_no, ts = line_no, found[1]
            added = line.startswith("Added request ", cut) and _added_known(line, cut, requests)
            if not added:  # (an Added line of a known request adds nothing, rejects nothing)
                msg = line[cut:-1] if line.endswith("\r") else line[cut:]
                rejected = rejects.count
                self._message(msg, found[0], ts, line_no)
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
        match = _FAST_LINE.match(head) if head else None
        found: tuple[str, str] | tuple[()] = ()
        if match is not None and match.end() == len(head) and match.group(2) is not None:
            found = (match.group(1), match.group(2))
        if len(self._envelopes) >= _HASH_CACHE_SIZE:
            self._envelopes.clear()
        self._envelopes[head] = found
        return found

    def _line(self, line: str, line_no: int) -> None:
        """One line by the per-line path (the reference for the fast path of :meth:`feed`)."""
        self.line_no = line_no
        match = _FAST_LINE.match(line)
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
        self._message(msg, level, ts, line_no)
        if self.out.rejects.count != rejected:
            return
        self._timed(ts, line_no)

    def _timed(self, ts: str, line_no: int) -> None:
        """A good line's time: the year's rollovers, and access lines waiting for a time."""
        if ts != self.last_ts:  # a second's lines share one timestamp: track it once
            self.last_ts = ts
            self._track_year(ts, line_no)
        if self.pending_access:
            self._settle_access(ts)

    def _envelope(self, line: str, line_no: int) -> tuple[str, str, str] | None:
        """Level, timestamp and message of a line the fast pattern did not read; ``None``
        when it has no envelope (then it is handled here)."""
        if "\x1b" in line:
            line = _strip_ansi(line)
        if line.endswith("\r"):
            line = line[:-1]
        start = 0
        if line.startswith("("):
            tag = _TAG.match(line)
            start = tag.end() if tag else 0
        match = _ENVELOPE.match(line, start)
        if match is None:
            self._other(line, start, line_no)
            return None
        return match.group("level"), match.group("ts"), line[match.end() :]

    def _track_year(self, ts: str, line_no: int) -> None:
        """Note where the month falls back by more than half a year: a new year began."""
        if self.out.first_ts is None:
            self.out.first_ts = ts
        self.out.last_ts = ts
        month = int(ts[:2])
        if month < self.last_month - 6:
            self.out.rollovers.append(line_no)
        self.last_month = month

    def _other(self, line: str, start: int, line_no: int) -> None:
        if not line[start:].strip():
            self.out.rejects.add(BLANK, line_no, line)
            return
        access = _UVICORN.match(line, start)
        if access is not None:
            self._access(access, line_no)
            return
        if _UVICORN_OTHER.match(line, start):
            self.out.ignored["uvicorn line"] += 1
            return
        prefixed = _PREFIXED.match(line, start)
        if prefixed is not None:
            match = _ENVELOPE.match(line, prefixed.end())
            if match is not None:
                level, ts = match.group("level", "ts")
                self._enveloped(line[match.end() :], level, ts, line_no)
                return
        reason = "invalid utf-8" if "\ufffd" in line else "not a vLLM log line"
        self.out.rejects.add(reason, line_no, line)

    def _message(self, msg: str, level: str, ts: str, line_no: int) -> None:
        first = msg[:1]
        if first == "R":
            if msg.startswith(_TOKENIZER_LINES):  # /tokenize serves no prompt: not a request
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
                return self._stats(msg, ts, None)
        elif first == "G" and msg.startswith("Generated response "):
            return self._generated(msg, ts, line_no)
        elif first == "F" and msg.startswith("Finished request "):
            return self._finished(msg, ts, line_no)
        elif first == "E" and msg.startswith("Engine "):
            return self._engine_stats(msg, ts)
        elif first == "P" and msg.startswith("Prefix cache hit rate: GPU"):
            return self._v0_prefix_rate(msg, ts)
        elif first.isdigit() and " Engines Aggregated: " in msg:
            return self._engine_stats(msg, ts)
        if _cut_keyword(msg):
            self.out.rejects.add(CUT_OFF, line_no, msg)
            return None
        kind = "error line" if level in ("ERROR", "CRITICAL") else "other vLLM line"
        self.out.ignored[kind] += 1
        return None

    # --- requests ---------------------------------------------------------------------------

    def _record(self, request_id: str, ts: str, line_no: int) -> dict[str, Any]:
        record = self.requests.get(request_id)
        if record is None:
            record = {"request_id": request_id, "ts": ts, "_line": line_no, "_head": False}
            self.requests[request_id] = record
        return record

    def _engine_id(self, request_id: str) -> str:
        """Strip the engine's 8-hex suffix when the id without it is known (FORMATS.md 1.12)."""
        if request_id in self.requests:
            return request_id
        base = ENGINE_SUFFIX.sub("", request_id)
        return base if base in self.requests else request_id

    def _set_status(self, request_id: str, status: str, ts: str, line_no: int) -> None:
        _settle(self._record(request_id, ts, line_no), status)

    def _received(self, msg: str, ts: str, line_no: int) -> None:
        colon = msg.find(": ", 17)
        if colon < 0 or not msg.endswith("."):
            self.out.rejects.add("malformed Received request line", line_no, msg)
            return
        request_id = msg[17:colon]
        try:  # read every field before touching the joins: a bad line changes nothing
            prompt, (fields, ids), id_count = self._received_fields(msg, colon + 2, len(msg) - 1)
        except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
            self.out.rejects.add(
                f"malformed Received request line: {type(exc).__name__}", line_no, msg
            )
            return
        record = self._new_head(request_id, ts, line_no)
        if prompt is not _NO_PROMPT:
            self._set_prompt(record, prompt)
        record.update(fields)
        if id_count is None:
            self._set_ids(record, ids)
        else:
            self._set_id_count(record, id_count)

    def _new_head(self, request_id: str, ts: str, line_no: int) -> dict[str, Any]:
        """The record a ``Received request`` line is the head of (its fields are set by the
        caller)."""
        record = self.requests.get(request_id)
        if record is not None and (record["_head"] or record.get("status") is not None):
            # A reused id (client X-Request-Id, a restart) is a new request: later lines join
            # the new one. An outcome seen before it belongs to an earlier request (a tail);
            # a DEBUG details line printed just before it belongs to this one.
            self.requests[f"{request_id}\x00{line_no}"] = self.requests.pop(request_id)
            record = None
        if record is None:  # (one literal: the usual case, a request not seen before)
            record = self.requests[request_id] = {
                "request_id": request_id, "ts": ts, "_line": line_no, "_head": True,
                "status": "received", "endpoint": endpoint_of(request_id),
            }  # fmt: skip
            return record
        record["ts"], record["_line"], record["_head"] = ts, line_no, True
        record.setdefault("status", "received")
        record["endpoint"] = endpoint_of(request_id)
        return record

    def _received_fields(self, msg: str, start: int, end: int) -> tuple[Any, _Rest, int | None]:
        """The prompt of ``msg[start:end]`` (:data:`_NO_PROMPT` when it prints none), what
        follows it read (:data:`_Rest`), and the count of its token ids when they were only
        counted; raises ``ValueError`` unless the line is whole (a cut line ends inside a
        value). The prompt comes first and is read first; what follows it (parameters, token
        ids, adapter) is read once per distinct text (clients repeat theirs; a completion's
        token ids, unique, are counted and left out of that text when its prompt is read)."""
        prompt: Any = _NO_PROMPT
        if msg.startswith("prompt: ", start, end):
            found = python_str_at(msg, start + 8, end)
            if found is None:
                raise ValueError("prompt is not a string literal")
            prompt, start = found
        rest = msg[start:end]
        read = self._rest_cache.get(rest)
        id_count = None
        if read is None and isinstance(prompt, str):  # (its ids give no hashes then)
            rest, id_count = without_token_ids(rest)
            read = self._rest_cache.get(rest)
        if read is None:
            read = self._after_prompt(rest)
            if len(rest) <= _CACHED_REST_CHARS:
                if len(self._rest_cache) >= _HASH_CACHE_SIZE:
                    self._rest_cache.clear()
                self._rest_cache[rest] = read
        return prompt, read, id_count

    def _after_prompt(self, rest: str) -> _Rest:
        """The fields of what follows a ``Received request`` line's prompt (or its id, when it
        has none), and its printed token ids: the tail keys are found from the right (a value
        never holds them)."""
        fields: dict[str, Any] = {}
        start, end = 0, len(rest)
        tail: dict[str, str] = {}
        for key in _TAIL_KEYS:
            cut = rest.rfind(key, start, end)
            if cut >= 0:
                tail[key[2:-2]] = rest[cut + len(key) : end]
                end = cut
        if not tail or not all(map(whole_value, tail.values())):
            raise ValueError("no whole lora_request / prompt_token_ids part")
        params = _PARAMS.search(rest, start, end)
        if params is None:
            raise ValueError("no params")
        close = rest.rfind(")", start, end)
        if close < 0:
            raise ValueError("params are not closed")
        self._sampling(fields, params.group("kind"), rest[params.end() : close])
        lora = tail.get("lora_request")
        if lora and lora != "None":
            name = _LORA_NAME.search(lora)
            fields["adapter"] = name.group(1) if name else lora
        return fields, tail.get("prompt_token_ids") or tail.get("prompt token ids")

    def _set_prompt(self, record: dict[str, Any], prompt: str | None) -> None:
        """The prompt of ``record``; its prefix hashes come when the piece ends
        (:meth:`_hash_prompts`)."""
        record["prompt"] = prompt
        if prompt is None:
            return
        if len(prompt) > self.out.longest_prompt:
            self.out.longest_prompt = len(prompt)
        self._prompted.append((record, prompt))
        record["prefix_hashes"] = _HASHED_LATER  # (text hashes win over token ids' hashes)

    def _hash_prompts(self) -> None:
        """The prefix hashes of the piece's prompts, hashed together (each distinct prompt
        once, in log order: :meth:`~pipeline.ingest.hashing.PrefixHasher.hashes_many`), set
        on their records in the order the records took them."""
        prompts = list(dict.fromkeys(prompt for _, prompt in self._prompted))
        hashes = dict(zip(prompts, self._hasher.hashes_many(prompts), strict=True))
        for record, prompt in self._prompted:
            record["prefix_hashes"] = hashes[prompt]
        self._prompted.clear()

    def _set_ids(self, record: dict[str, Any], ids: str | None) -> None:
        if not ids or ids == "None" or not ids.startswith("["):
            return
        body = ids[1 : ids.rfind("]")]
        count = listed_count(body)
        self._set_id_count(record, count)
        if record.get("prefix_hashes") is None and count >= self.block_size:
            token_ids = as_token_ids(body)
            if token_ids is None:  # (the record keeps what else its lines said)
                self.out.ignored["token ids not integers (no block hashes from them)"] += 1
                return
            record["prefix_hashes"] = block_hashes_from_ids(token_ids, self.block_size)

    def _set_id_count(self, record: dict[str, Any], count: int) -> None:
        record["_ids_len"] = count
        if count > self.out.longest_ids:
            self.out.longest_ids = count
        prompt = record.get("prompt")
        if prompt is not None and len(prompt) == count and cut_looking(prompt, count):
            self.out.cap_evidence[count] += 1

    def _sampling(self, record: dict[str, Any], kind: str, body: str) -> None:
        if kind != "SamplingParams":
            return
        fields = self._params_cache.get(body)
        if fields is None:
            if len(self._params_cache) >= _HASH_CACHE_SIZE:
                self._params_cache.clear()
            fields = self._params_cache[body] = sampling_fields(body)
        record.update(fields)

    def _request_line(self, msg: str, ts: str, line_no: int) -> None:
        """``Request <id> details: ...`` (DEBUG prompt) and ``Request <id> aborted./failed``."""
        space = msg.find(" ", 8)
        request_id, rest = msg[8:space], msg[space + 1 :]
        known = space >= 0 and rest.startswith(_REQUEST_KEYWORDS)
        if (known and not msg.endswith(".")) or space < 0 or _cut_keyword(rest, _REQUEST_KEYWORDS):
            self.out.rejects.add(CUT_OFF, line_no, msg)  # these end with "." (FORMATS.md 1.6)
            return None
        if not known:  # "Request <id> JSON body: ..." (DEBUG, 0.32) and others
            self.out.ignored["other vLLM line"] += 1
            return None
        if rest.startswith("details: prompt: "):
            return self._details(request_id, rest[17:], ts, line_no)
        if rest.startswith("aborted"):
            return self._set_status(request_id, "aborted", ts, line_no)
        if rest.startswith("failed"):
            bad = rest.startswith(("failed (bad request)", "failed (input error)"))
            return self._set_status(request_id, "rejected" if bad else "failed", ts, line_no)
        return None

    def _details(self, request_id: str, rest: str, ts: str, line_no: int) -> None:
        try:
            found = python_str_at(rest, 0)
            if found is None:
                raise ValueError("prompt is not a string literal")
            ids_at = rest.rfind(", prompt_token_ids: ")
            embeds_at = rest.rfind(", prompt_embeds shape: ")
            ids = None
            if ids_at >= 0:
                stop = embeds_at if embeds_at > ids_at else len(rest) - 1
                ids = rest[ids_at + 20 : stop]
            if ids is None or not whole_value(ids) or found[1] > ids_at:
                raise ValueError("no whole prompt_token_ids part")
        except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
            self.out.rejects.add(
                f"malformed Request details line: {type(exc).__name__}", line_no, rest
            )
            return
        record = self._record(request_id, ts, line_no)
        self._set_prompt(record, found[0])
        self._set_ids(record, ids)

    def _added(self, msg: str, ts: str, line_no: int) -> None:
        if not msg.endswith(".") or len(msg) < 16:
            self.out.rejects.add(CUT_OFF, line_no, msg)
            return
        request_id = msg[14:-1]
        if request_id not in self.requests:  # else known: nothing to add
            self._record(self._engine_id(request_id), ts, line_no)

    def _finished(self, msg: str, ts: str, line_no: int) -> None:
        if not msg.endswith(".") or len(msg) < 19:
            self.out.rejects.add(CUT_OFF, line_no, msg)
            return
        self._set_status(self._engine_id(msg[17:-1]), "ok", ts, line_no)

    def _aborted(self, msg: str, ts: str, line_no: int) -> None:
        if not msg.endswith("."):
            self.out.rejects.add(CUT_OFF, line_no, msg)
            return
        ids = msg.split(" ", 2)[-1][:-1]
        for request_id in ids.split(","):
            if request_id:
                self._set_status(self._engine_id(request_id.strip()), "aborted", ts, line_no)

    def _generated(self, msg: str, ts: str, line_no: int) -> None:
        colon = msg.find(": output: ")
        if colon < 0:
            if " details: output_token_ids: " in msg:
                return self._generated_details(msg, ts, line_no)
            self.out.rejects.add("malformed Generated response line", line_no, msg)
            return None
        reason_at = msg.rfind(", finish_reason: ")
        ids_at = msg.rfind(", output_token_ids: ", 0, reason_at if reason_at >= 0 else None)
        reason = msg[reason_at + 17 :] if reason_at >= 0 else None
        ids = msg[ids_at + 20 : reason_at] if ids_at >= 0 and reason_at >= 0 else None
        if reason not in FINISH_REASONS or (ids is not None and not whole_value(ids)):
            self.out.rejects.add("malformed Generated response line", line_no, msg)
            return None
        request_id, _, mode = msg[19:colon].partition(" ")
        record = self._record(request_id, ts, line_no)
        self._count_output(record, mode, ids)
        if reason in _FINISHED_OK and reason != "abort":
            _settle(record, "ok")
        return None

    def _generated_details(self, msg: str, ts: str, line_no: int) -> None:
        ids = msg[msg.find(" details: output_token_ids: ") + 28 :]
        if not whole_value(ids) or ids == "None":
            self.out.rejects.add("malformed Generated response line", line_no, msg)
            return
        request_id, _, mode = msg[19 : msg.find(" details: ")].partition(" ")
        self._count_output(self._record(request_id, ts, line_no), mode, ids)

    def _count_output(self, record: dict[str, Any], mode: str, ids: str | None) -> None:
        if ids is None or not ids.startswith("["):
            return
        count = listed_count(ids[1 : ids.rfind("]")])
        if count > self.out.longest_ids:  # --max-log-len cuts output ids too
            self.out.longest_ids = count
        if mode == "(streaming delta)":
            record["_delta_tokens"] = record.get("_delta_tokens", 0) + count
        else:
            record["output_tokens"] = count

    # --- uvicorn access lines ---------------------------------------------------------------

    def _access(self, match: re.Match[str], line_no: int) -> None:
        status = int(match.group("status"))
        if status < 400:
            self.out.ignored[ACCESS_OK_LINE] += 1
            return
        kind = "overloaded" if status in (429, 503) else ("rejected" if status < 500 else "failed")
        row = {"request_id": None, "ts": self.last_ts, "_line": line_no, "_head": True,
               "endpoint": match.group("path").split("?")[0], "status": kind}  # fmt: skip
        if self.last_ts is None:
            self.pending_access.append(row)
        self.out.heads.append(row)

    def _settle_access(self, ts: str) -> None:
        for row in self.pending_access:
            row["ts"] = ts
        self.pending_access.clear()

    # --- stats ------------------------------------------------------------------------------

    def _engine_stats(self, msg: str, ts: str) -> None:
        head, _, rest = msg.partition(": ")
        if rest.startswith("Avg prompt"):
            self._stats(rest, ts, head)
        else:
            self.out.ignored["other vLLM line"] += 1

    def _stats(self, msg: str, ts: str, engine: str | None) -> None:
        if not whole_stats(msg):
            self.out.rejects.add("malformed stats line", self.line_no, msg)
            return
        row: dict[str, Any] = {"ts": ts, "source": "vllm", "instance": self._instance(engine),
                               "_line": self.line_no}  # fmt: skip
        row.update(stats_values(msg))
        self.out.metrics.append(row)

    def _v0_prefix_rate(self, msg: str, ts: str) -> None:
        rates = v0_prefix_rates(msg)
        if rates is None:
            self.out.ignored["other vLLM line"] += 1
            return
        last = self.out.metrics[-1] if self.out.metrics else None
        if last is not None and last["ts"] == ts and "prefix_cache_hit_rate" not in last:
            last.update(rates)
            return
        self.out.metrics.append(
            {"ts": ts, "source": "vllm", "instance": self.instance, "_line": self.line_no, **rates}
        )

    def _instance(self, engine: str | None) -> str:
        return f"{self.instance}/{engine}" if engine else self.instance

    # --- end of chunk -----------------------------------------------------------------------

    def finish(self) -> ChunkResult:
        """Split joined requests into heads (defining line seen here) and tails."""
        self._hash_prompts()
        for record in self.requests.values():
            if record.pop("_head"):
                delta = record.pop("_delta_tokens", None)
                if delta is not None and record.get("output_tokens") is None:
                    record["output_tokens"] = delta
                self.out.heads.append(record)
            else:  # streaming deltas stay a count to add: the head's chunk has the first ones
                self.out.tails[record["request_id"]] = record
        self.out.heads.sort(key=lambda r: r["_line"])
        return self.out
