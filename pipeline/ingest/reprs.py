"""Reading the printed forms of values in logs, safely: never ``eval``.

* Python ``repr()`` strings (vLLM prompts and outputs): located with one regular expression,
  escapes decoded by a table (``\\n``, ``\\xhh``, ``\\uhhhh`` ...): the same text
  ``ast.literal_eval`` gives, about 10x faster, and nothing is ever evaluated.
* ``SamplingParams(k=v, ...)`` (vLLM) and ``GenerateParameters { k: v, ... }`` (TGI, Rust
  ``Debug``): split at top level by a small scanner that skips quoted strings and nested
  brackets; values stay text, the few the records need are converted one by one.
* Rust ``Debug`` strings (``"a \\"b\\" \\u{e9}"``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping

#: a Python string literal as repr() prints it (single or double quoted, escapes kept)
#: (unrolled loops: one C-level scan per run of plain characters, not one step per character)
PY_STR = re.compile(r"'[^'\\]*(?:\\.[^'\\]*)*'|\"[^\"\\]*(?:\\.[^\"\\]*)*\"", re.DOTALL)
_PY_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", re.DOTALL)
_PY_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "0": "\0",
              "a": "\a", "b": "\b", "f": "\f", "v": "\v"}  # fmt: skip
_STRUCTURE = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[()\[\]{},]", re.DOTALL)
_RUST_ESCAPE = re.compile(r"\\(u\{[0-9a-fA-F]{1,6}\}|.)", re.DOTALL)
_RUST_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}
_OPEN, _CLOSE = "([{", ")]}"

#: canonical names of the sampling parameters that decide a response (hashed for cache keys)
PARAMS_HASHED = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "seed",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "structured_outputs",
)


def python_str_at(text: str, pos: int, end: int | None = None) -> tuple[str | None, int] | None:
    """The Python string literal (or ``None``) starting at ``text[pos]``, and where it ends;
    with ``end``, read as if ``text`` ended there.

    Returns ``None`` when there is neither a literal nor ``None`` at ``pos``.
    """
    if text.startswith("None", pos, end):
        return None, pos + 4
    plain = _plain_str_at(text, pos, end)
    if plain is not None:
        return plain
    match = PY_STR.match(text, pos, len(text) if end is None else end)
    if match is None:
        return None
    return decode_python_str(match.group()), match.end()


def _plain_str_at(text: str, pos: int, end: int | None) -> tuple[str, int] | None:
    """The usual literal read by ``str.find``: one whose only escapes are ``\\n`` ends at the
    first quote after its opening one (any other quote would be escaped). ``None`` when the
    literal has other escapes (or none is at ``pos``): :data:`PY_STR` reads it then."""
    quote = text[pos : pos + 1]
    if quote != "'" and quote != '"':
        return None
    close = text.find(quote, pos + 1, end)
    if close < 0:
        return None
    decoded = _newlines_decoded(text[pos + 1 : close])
    return None if decoded is None else (decoded, close + 1)


def _newlines_decoded(body: str) -> str | None:
    """``body`` with its ``\\n`` escapes decoded; ``None`` if it holds any other escape (a
    backslash is left once they are). Three C-level passes whatever the number of escapes
    (a ``find`` per escape took 2.3 µs on a chat prompt of ~900 characters)."""
    if "\\" not in body:
        return body
    decoded = "\n".join(body.split("\\n"))
    return None if "\\" in decoded else decoded


def decode_python_str(literal: str) -> str:
    """Decode one quoted Python string literal (as printed by ``repr``)."""
    body = literal[1:-1]
    decoded = _newlines_decoded(body)  # no escapes but newlines: the usual chat prompt
    return decoded if decoded is not None else _PY_ESCAPE.sub(_py_escape, body)


#: a line's reject reason when a value of it is no valid text
NOT_TEXT = "a value that is no valid text (a lone surrogate)"


class NotACharacterError(ValueError):
    """A printed string escapes a code point that is no character: a lone surrogate (Python's
    ``repr`` prints one of a string that is no valid text as ``\\udXXX``; JSON and Rust allow
    it too) or one past U+10FFFF. Such a string cannot be kept as text (not in UTF-8, not in
    Arrow), so the line that holds it is a reject, not a crash."""


def _character(value: int, escape: str) -> str:
    if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
        raise NotACharacterError(f"\\{escape} is not a character")
    return chr(value)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(values: Iterable[object]) -> None:
    """Raise :class:`NotACharacterError` if a string of ``values`` holds a lone surrogate
    (a JSON decoder gives one for ``"\\ud800"``); an ASCII string is passed at once."""
    for value in values:
        if isinstance(value, str) and not value.isascii() and _LONE_SURROGATE.search(value):
            raise NotACharacterError(f"{value[:40]!r} holds a lone surrogate")


def _py_escape(match: re.Match[str]) -> str:
    code = match.group(1)
    if len(code) > 1:  # \xhh, \uhhhh, \Uhhhhhhhh
        return _character(int(code[1:], 16), code)
    return _PY_SIMPLE.get(code, "\\" + code)


def split_top_level(body: str, sep: str = ",") -> list[str]:
    """Split ``body`` at ``sep`` characters outside quotes and brackets; parts are stripped.

    Unbalanced closing brackets (vLLM 0.6.3 prints ``...=None), guided_decoding=None``) are
    tolerated: depth never goes below zero.
    """
    parts: list[str] = []
    depth, start = 0, 0
    for match in _STRUCTURE.finditer(body):
        char = match.group()
        if len(char) > 1:
            continue
        if char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth = max(0, depth - 1)
        elif depth == 0 and char == sep:
            parts.append(body[start : match.start()].strip())
            start = match.end()
    parts.append(body[start:].strip())
    return [p for p in parts if p]


def key_values(body: str, assign: str = "=") -> dict[str, str]:
    """Alias of :func:`parse_key_values`."""
    return parse_key_values(body, assign)


def parse_key_values(body: str, assign: str = "=") -> dict[str, str]:
    """``k=v, ...`` (or ``k: v, ...``) at top level -> ``{k: raw v}``; stray ``)`` dropped."""
    out: dict[str, str] = {}
    for part in split_top_level(body):
        key, found, value = part.partition(assign)
        if found and key.strip().isidentifier():
            value = value.strip()
            if value.endswith(")") and value.count(")") > value.count("("):
                value = value[:-1]
            out[key.strip()] = value
    return out


def _py_scalar(raw: str | None) -> object:
    if raw is None or raw == "None":
        return None
    if raw in ("True", "False"):
        return raw == "True"
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


def as_float(raw: str | None) -> float | None:
    """A float from printed text (``None`` and junk give ``None``)."""
    value = _py_scalar(raw)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


#: the records' integers are 64-bit: a printed one outside is left out, never wrapped
INT64 = range(-(2**63), 2**63)
#: what an unsigned 64-bit integer (a seed) holds
UINT64 = range(2**64)


def as_int(raw: str | None) -> int | None:
    """An int from printed text (floats with a fraction or not finite, integers past 64 bits,
    ``None`` and junk give ``None``)."""
    value = _py_scalar(raw)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        return None
    number = int(value)
    return number if number in INT64 else None


def as_count(value: float) -> int | None:
    """``value`` rounded to the nearest integer (ties to even), when that is a 64-bit one
    (a ratio of junk durations can be huge or infinite)."""
    if not math.isfinite(value):
        return None
    rounded = round(value)
    return rounded if rounded in INT64 else None


def seed_u64(raw: str | None) -> int | None:
    """A seed exactly as printed, when it is an unsigned 64-bit integer (TGI's ``u64``, vLLM's
    non-negative ``int``); anything else (negative, larger, not an integer) is left out, never
    wrapped or rounded."""
    if raw is None or not (raw.isascii() and raw.isdigit()):
        return None
    value = int(raw)
    return value if value in UINT64 else None


def params_hash(params: Mapping[str, object]) -> str:
    """Stable hash of the response-deciding sampling parameters (16 hex digits).

    Only names in :data:`PARAMS_HASHED` count, as normalised text; ``top_k`` 0 and -1 (both
    "off") hash alike. Comparable within one engine kind.
    """
    chosen = {k: params[k] for k in PARAMS_HASHED if params.get(k) is not None}
    if str(chosen.get("top_k")) in ("-1", "0"):
        chosen.pop("top_k")
    text = json.dumps({k: str(v) for k, v in chosen.items()}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


# --- Rust Debug -----------------------------------------------------------------------------


def decode_rust_str(literal: str) -> str:
    """Decode a double-quoted Rust ``Debug`` string (``\\"``, ``\\n``, ``\\u{e9}`` ...)."""
    inner = literal[1:-1] if literal.startswith('"') and literal.endswith('"') else literal
    if "\\" not in inner:
        return inner
    if "\\" not in inner.replace('\\"', ""):  # only quotes escaped: a span's parameters
        return inner.replace('\\"', '"')
    return _RUST_ESCAPE.sub(_rust_escape, inner)


def _rust_escape(match: re.Match[str]) -> str:
    code = match.group(1)
    if code.startswith("u{"):
        return _character(int(code[2:-1], 16), code)
    return _RUST_SIMPLE.get(code, "\\" + code)


def rust_option(raw: str | None) -> str | None:
    """``Some(x)`` -> ``x``; ``None``/missing -> ``None``; anything else as it is."""
    if raw is None or raw == "None":
        return None
    if raw.startswith("Some(") and raw.endswith(")"):
        return raw[5:-1]
    return raw


def generate_parameters(text: str) -> dict[str, str]:
    """Fields of TGI's ``GenerateParameters { k: v, ... }`` Debug text, values as raw text."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return {}
    return key_values(text[start + 1 : end], assign=":")
