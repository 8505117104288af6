"""Limits on untrusted text, checked before any parser or renderer starts on it.

Python's own parsers recurse: ``json.loads`` of 100,000 nested brackets and Jinja2's parser on
20,000 nested ``{% if %}`` raise ``RecursionError`` (or take the interpreter down with them), and
a 50 MB template is parsed in a minute and 760 MB. Each check here is a linear scan that refuses
such input with a :class:`BadInputError` naming the file and line, so callers can skip it and
carry on with the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.errors import BadInputError


@dataclass(frozen=True, slots=True)
class TextLimits:
    """How large and how deeply nested one piece of untrusted text may be.

    The defaults leave room for every real template and chat template we know (the largest
    chat templates in public ``tokenizer_config.json`` files are ~20 kB with nesting under 20),
    and keep the parsers well inside Python's default recursion limit of 1,000.
    """

    max_bytes: int = 1024 * 1024
    max_depth: int = 64
    max_lines: int = 50_000


DEFAULT_LIMITS = TextLimits()
# A JSON string (with escapes) or one bracket; strings are skipped so brackets inside them
# do not count.
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.S)
_OPEN = frozenset(b"[{")


def line_of(data: bytes | str, offset: int) -> int:
    """1-based line number of ``offset`` in ``data``."""
    if isinstance(data, bytes):
        return data.count(b"\n", 0, offset) + 1
    return data.count("\n", 0, offset) + 1


def check_size(data: bytes | str, where: str, limits: TextLimits = DEFAULT_LIMITS) -> None:
    """Refuse text over ``limits.max_bytes`` (before anything reads it further)."""
    size = len(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    if size > limits.max_bytes:
        raise BadInputError(
            f"{size} bytes is over the limit of {limits.max_bytes} bytes", where=f"{where}:1"
        )


def check_json_depth(data: bytes | str, where: str, max_depth: int) -> None:
    """Refuse JSON whose arrays/objects nest deeper than ``max_depth``, naming the line."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    depth = 0
    for token in _JSON_TOKEN.finditer(raw):
        first = raw[token.start()]
        if first in _OPEN:
            depth += 1
            if depth > max_depth:
                line = line_of(raw, token.start())
                raise BadInputError(
                    f"JSON nested deeper than {max_depth} levels", where=f"{where}:{line}"
                )
        elif first != 0x22:  # a closing bracket (0x22 is '"', a string)
            depth = max(0, depth - 1)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_json(
    data: bytes | str,
    where: str,
    limits: TextLimits = DEFAULT_LIMITS,
    hook: Callable[[Any], Any] | None = None,
) -> Any:
    """``json.loads`` with size and depth checked first; ``NaN``/``Infinity`` are refused.

    Any failure is a :class:`BadInputError` naming ``where`` and the line.
    """
    check_size(data, where, limits)
    check_json_depth(data, where, limits.max_depth)
    try:
        return json.loads(data, parse_constant=_refuse_constant, object_hook=hook)
    except json.JSONDecodeError as exc:
        raise BadInputError(f"not valid JSON ({exc.msg})", where=f"{where}:{exc.lineno}") from exc
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # ValueError: a refused constant, or an integer over Python's 4,300-digit limit.
        raise BadInputError(f"not valid JSON ({exc})", where=f"{where}:1") from exc
