"""Prefixes a container runtime puts before every line an engine printed.

Logs often reach prewarm through the tool that ran the engine rather than straight from it:

* ``docker compose logs`` puts the service and replica before each line (``vllm-1  | ``;
  Compose v1: ``vllm_1  | ``);
* ``kubectl logs --prefix`` the pod and container (``[pod/vllm-6d4f/vllm] ``);
* ``kubectl logs --timestamps`` and ``docker logs --timestamps`` the time the runtime received
  the line, RFC 3339 with up to nanoseconds (``2025-06-03T09:42:00.118204123Z ``), after the
  Compose or kubectl prefix when both are asked for;
* ``journalctl`` (an engine run as a systemd unit) the time, host and process, in its
  ``short``, ``short-precise`` and ``short-iso`` outputs
  (``Jun 03 09:42:00 gpu-7 vllm[2301]: ``, ``2025-06-03T09:42:00+0000 gpu-7 vllm[2301]: ``).

A file's prefix is found from its head (:func:`pipeline.ingest.detect.detect`): the one that
makes the most head lines read as a format, when it precedes nearly all of them. Each line
then loses it before it is parsed; a line without it is read as it is. Offsets, line numbers
and reject samples stay the file's own.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

#: (a terminal gets the service name in colour: the codes are part of the prefix)
_COMPOSE = r"(?:\x1b\[[0-9;]*m)*[\w.-]+[-_]\d+ *\|(?:\x1b\[[0-9;]*m)* ?"
_KUBECTL = r"\[pod/[^\]\s]+\] "
_STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) "
_JOURNAL = (
    r"(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d{1,6})?"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,6})?(?:Z|[+-]\d\d:?\d\d)) "
    r"[^\s]+ [^\s\[\]:]+(?:\[\d+\])?: "
)

#: name -> the prefix at the start of a line, longest combinations first
LINE_PREFIXES: dict[str, str] = {
    "docker compose, timestamps": _COMPOSE + _STAMP,
    "docker compose": _COMPOSE,
    "kubectl prefix, timestamps": _KUBECTL + _STAMP,
    "kubectl prefix": _KUBECTL,
    "runtime timestamps": _STAMP,
    "journalctl": _JOURNAL,
}
#: the share of a head's lines a prefix must start for the file to be read as prefixed
SHARE = 0.9


@functools.cache
def pattern(name: str) -> re.Pattern[str]:
    """The compiled prefix called ``name``."""
    return re.compile(LINE_PREFIXES[name])


def stripped(lines: Sequence[str], name: str) -> list[str]:
    """``lines`` without the prefix ``name`` where they start with it."""
    match = pattern(name).match
    out = []
    for line in lines:
        found = match(line)
        out.append(line[found.end() :] if found is not None else line)
    return out


def candidates(lines: Sequence[str]) -> list[str]:
    """The prefixes that start at least :data:`SHARE` of ``lines``."""
    if not lines:
        return []
    return [
        name
        for name in LINE_PREFIXES
        if sum(1 for line in lines if pattern(name).match(line)) >= SHARE * len(lines)
    ]
