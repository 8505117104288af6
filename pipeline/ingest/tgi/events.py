"""What a TGI router log line is: the start of an event (``<RFC 3339 µs timestamp> <LEVEL> ``,
then the spans ``name{fields}:`` ... root first, a space, ``target: file.rs:line: `` and the
message), the next line of a multi-line message, or a launcher line; and a ``--json-output``
line as the same event.

A small scanner walks the spans (braces counted, ``"..."`` strings skipped), because span
fields contain ``: `` and ``{}``; the usual shape of a request event is read in one match.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from pipeline.ingest.reprs import decode_rust_str

EVENT_START = re.compile(
    r"(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) +(?P<level>TRACE|DEBUG|INFO|WARN|ERROR) "
)
_SPAN_NAME = re.compile(r"([A-Za-z_][\w ]*?)(\{|:(?!:))")
_BRACES = re.compile(r"\"(?:[^\"\\]|\\.)*\"|[{}]", re.DOTALL)
_FIELD_SPLIT = re.compile(r"\"(?:[^\"\\]|\\.)*\"|[{}\[\]()]| (?=[\w.]+=)", re.DOTALL)
TARGET = re.compile(r"(?P<target>[\w:]+): (?P<file>[\w/.-]+\.rs):(?P<line>\d+): ")
#: launcher and shard-manager lines: a target (``text_generation_launcher: ``) or a span
#: name first, no ``file.rs:line``
LAUNCHER = re.compile(r"[a-z_][\w-]*(?:::[\w-]+)*(?:\{[^{}]*\})?: ")
#: the usual shape of a request event, read in one match: ``handler{[parameters=...]
#: key="value"...}[:child...]: target: file.rs:line: `` (quoted or raw ``GenerateParameters``)
FAST_SPAN = re.compile(
    r"(?P<span>\w+)\{(?:parameters="
    r"(?P<params>\"[^\"\\]*(?:\\.[^\"\\]*)*\"|GenerateParameters \{[^{}]*\})(?= |\}))?"
    r"(?P<fields>(?: ?\w+=\"[^\"\\]*\")*)\}(?P<children>(?::\w+)*): "
    r"(?P<target>[\w:]+): [\w/.-]+\.rs:\d+: "
)
_QUOTED_FIELD = re.compile(r"(\w+)=\"([^\"\\]*)\"")
_OPENERS = ("{", "[", "(")
_CLOSERS = ("}", "]", ")")
#: messages printed raw, so they may hold newlines
_MULTILINE = ("Input: ", "Output: ", "Request failed during generation", "Server error")
#: parameters texts remembered decoded (least recently used dropped)
PARAMS_CACHE_SIZE = 4096
#: the request handlers' span names and the endpoints they serve
ENDPOINTS = {
    "chat_completions": "/v1/chat/completions",
    "completions": "/v1/completions",
    "compat_generate": "/",
    "generate": "/generate",
    "generate_stream": "/generate_stream",
}

Span = tuple[str, dict[str, str]]


@dataclass
class TgiEvent:
    """One log event: header, spans (root first) and the message."""

    ts: str
    level: str
    spans: list[Span]
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


# --- spans of a text event ------------------------------------------------------------------


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


@functools.lru_cache(maxsize=PARAMS_CACHE_SIZE)
def printed_parameters(params: str) -> str:
    """A span's parameters as printed, decoded (memoised: clients repeat them)."""
    return decode_rust_str(params) if params.startswith('"') else params


def fast_spans(match: re.Match[str]) -> list[Span]:
    """Spans of a :data:`FAST_SPAN` match."""
    fields = dict(_QUOTED_FIELD.findall(match.group("fields")))
    params = match.group("params")
    if params is not None:
        fields["parameters"] = printed_parameters(params)
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


def parse_spans(rest: str) -> tuple[list[Span], int]:
    """Spans at the start of ``rest`` (root first) and the offset of what follows them."""
    spans: list[Span] = []
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


def router_line(rest: str) -> bool:
    """Whether an event comes from the router (its handler spans or target), which always
    prints ``file.rs:line``: without them the line was cut."""
    name = re.match(r"[\w ]+", rest)
    return "text_generation_router" in rest or (
        name is not None and (name.group() in ENDPOINTS or name.group() == "HTTP request")
    )


# --- JSON events ----------------------------------------------------------------------------


def json_event(obj: Any, line_no: int) -> TgiEvent | None:
    """The event of a ``--json-output`` line's object; ``None`` for a launcher line (no
    per-request fields); raises ``TypeError`` / ``KeyError`` when it is no event."""
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
