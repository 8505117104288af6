"""What kind of line a vLLM log line is: its envelope (``LEVEL MM-DD HH:MM:SS [file:line] ``,
after an optional ``(APIServer pid=N)`` tag and colour codes), a uvicorn access line, or a line
cut short; and the names its rejects and ignored lines are counted under."""

from __future__ import annotations

import re
from collections.abc import Container

from pipeline.ingest.lines import ANSI

TAG = re.compile(r"\((?P<proc>[^()]+?) pid=(?P<pid>\d+)\) ")
ENVELOPE = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<ts>\d\d-\d\d \d\d:\d\d:\d\d) "
    r"\[?[^\]\s]+?:\d+\] "
)
#: the usual lines in one match, colour codes included: codes only where vLLM prints them
#: (around the tag, before the level), none inside the tag, the file name or an access line,
#: so the match reads what :func:`strip_ansi` + :data:`TAG` + :data:`ENVELOPE` (or
#: :data:`UVICORN`) read when the rest of the line has no code. Access lines leave the level
#: and time unset.
FAST_LINE = re.compile(
    r"(?:\x1b\[[0-9;]*m)*(?:\([^()\x1b]+ pid=\d+\)(?:\x1b\[[0-9;]*m)* )?(?:\x1b\[[0-9;]*m)*"
    r"(?:(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d) \[?[^\]\s\x1b]+?:\d+\] "
    r"|[A-Z]+:\s+[^\s\x1b]* - \"[A-Z]+ (?P<path>[^\s\x1b]+) HTTP/[\d.]+\" (?P<status>\d{3}))"
)
PREFIXED = re.compile(r".{0,64}?(?=(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d )")
UVICORN = re.compile(
    r"(?P<level>[A-Z]+):\s+(?P<client>\S*) - \"(?P<method>[A-Z]+) (?P<path>\S+) "
    r"HTTP/[\d.]+\" (?P<status>\d{3})"
)
UVICORN_OTHER = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):\s")

#: starts of the messages that carry data: a message that is a proper start of one of them
#: (the empty message included) is a line cut short, not some other logger's line
DATA_KEYWORDS = (
    "Received request ", "Request ", "Added request ", "Aborted request", "Finished request ",
    "Generated response ", "Avg prompt throughput", "Engine ", "Prefix cache hit rate: GPU",
)  # fmt: skip
#: what follows ``Request <id> `` on the lines that carry data
REQUEST_KEYWORDS = ("details: prompt: ", "aborted", "failed")
#: request-logger lines of ``/tokenize`` and ``/detokenize`` calls (vLLM 0.32 logs their
#: prompt as it logs a completion's): no request was served, no cache block was used
TOKENIZER_LINES = (
    "Received request tokenize-", "Request tokenize-",
    "Received request detokenize-", "Request detokenize-",
)  # fmt: skip

BLANK = "blank line"
#: what a served request's access line counts as (the request is joined by its id)
ACCESS_OK_LINE = "access line (joined by id only)"
#: a failed call of a route that runs no request (a router's ``/v1/completions/render`` or
#: ``/tokenize`` on every replica, a probe of ``/health``): not a rejected request
NOT_A_REQUEST_LINE = "access line of a route that runs no request"
CUT_OFF = "cut-off line"
OTHER_LINE = "other vLLM line"


def cut_keyword(msg: str, keywords: tuple[str, ...] = DATA_KEYWORDS) -> bool:
    """A message that stops inside the first words of a data message (or an empty one:
    nothing after the envelope) is a line cut short; ``keywords``: those first words."""
    return any(len(msg) < len(key) and key.startswith(msg) for key in keywords)


def added_known(line: str, cut: int, requests: Container[str]) -> bool:
    """Whether ``line``, whose message from ``cut`` starts with ``Added request `` (no colour
    code in it), is a whole ``Added request <id>.`` line of a request already known: such a
    line adds nothing (its time counts), so the loop takes it without cutting its message
    out or dispatching it (a third of its cost; a vLLM INFO log has one per request)."""
    return line.endswith(".") and len(line) - cut >= 16 and line[cut + 14 : -1] in requests


def strip_ansi(line: str) -> str:
    """``line`` without colour codes; only the part up to the last code is rewritten (codes
    colour the envelope, a long message after them is copied once, not scanned again)."""
    last = line.rfind("\x1b")
    end = line.find("m", last) + 1 or last + 1  # a code cannot hold an "m" before its end
    return ANSI.sub("", line[:end]) + line[end:]


def access_status(status: int) -> str:
    """The status of a request a failed access line (4xx/5xx) reports."""
    if status in (429, 503):
        return "overloaded"
    return "rejected" if status < 500 else "failed"
