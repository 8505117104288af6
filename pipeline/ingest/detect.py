"""Which format a file is in, from its first lines (``.gz`` looked into); override with
``IngestOptions.format``.

Each format has a line test; the format whose test matches the most of the first
:data:`SAMPLE_LINES` non-blank lines wins. vLLM logs hold many lines of other loggers at
start-up, so a format needs only some matching lines, not all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from pipeline.ingest.lines import read_head
from pipeline.ingest.tgi import EVENT_START
from pipeline.ingest.vllm import ANSI

LOG_FORMATS = ("vllm", "tgi-text", "tgi-json")
TRACE_FORMATS = ("mooncake", "azure", "servegen", "prewarm-jsonl")
FORMATS = LOG_FORMATS + TRACE_FORMATS
SAMPLE_LINES = 200
HEAD_BYTES = 256 << 10

_VLLM = re.compile(
    r"(?:\([^()]+? pid=\d+\) )?.{0,64}?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"\d\d-\d\d \d\d:\d\d:\d\d \[?[^\]\s]+?:\d+\] "
)
_UVICORN = re.compile(r"(?:\([^()]+? pid=\d+\) )?(?:INFO|WARNING|ERROR):\s+\S+ - \"")
_SERVEGEN = re.compile(r"\d+(?:\.\d+)?,\d+(?:\.\d+)?(?:e-?\d+)?,[^,]*,[A-Za-z]*,[^,]*,[^,]*$")
_AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
_AZURE_ROW = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?,\d+,\d+$")


def _json(line: str) -> dict[str, object] | None:
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _is_tgi_json(line: str) -> bool:
    obj = _json(line)
    return obj is not None and "timestamp" in obj and "level" in obj and "target" in obj


def _is_mooncake(line: str) -> bool:
    obj = _json(line)
    return obj is not None and "hash_ids" in obj and "input_length" in obj


def _is_prewarm(line: str) -> bool:
    obj = _json(line)
    return obj is not None and "ts" in obj and "hash_ids" not in obj


LINE_TESTS: dict[str, Callable[[str], bool]] = {
    "vllm": lambda line: bool(_VLLM.match(line) or _UVICORN.match(line)),
    "tgi-text": lambda line: bool(EVENT_START.match(line)),
    "tgi-json": _is_tgi_json,
    "mooncake": _is_mooncake,
    "azure": lambda line: line.startswith(_AZURE_HEADER) or bool(_AZURE_ROW.match(line)),
    "servegen": lambda line: bool(_SERVEGEN.match(line)),
    "prewarm-jsonl": _is_prewarm,
}


def head_lines(path: Path, limit: int = SAMPLE_LINES) -> list[str]:
    """The first non-blank lines of a file, ANSI codes stripped, bad bytes replaced."""
    text = read_head(path, HEAD_BYTES).decode("utf-8", "replace")
    lines = [ANSI.sub("", line).rstrip("\r") for line in text.split("\n")[:-1] or [text]]
    return [line for line in lines if line.strip()][:limit]


def detect_format(path: str | Path) -> str | None:
    """The most likely format of ``path``, or ``None`` when no line of its head matches."""
    path = Path(path)
    lines = head_lines(path)
    if not lines:
        return None
    if lines[0].startswith(_AZURE_HEADER):
        return "azure"
    scores = {name: sum(1 for line in lines if test(line)) for name, test in LINE_TESTS.items()}
    if path.name.endswith(("-trace.csv", "-trace.csv.gz")) and scores["servegen"]:
        return "servegen"
    best = max(scores, key=lambda name: scores[name])
    return best if scores[best] > 0 else None
