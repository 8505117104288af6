"""A value that is no valid text costs its line, never the run.

A log can print a string that holds a lone surrogate: Python's ``repr`` prints one as
``\\udXXX`` (vLLM's prompts), Rust's ``Debug`` as ``\\u{d800}`` and JSON as ``\\ud800`` (TGI). No
such value can be kept (not in UTF-8, not in Arrow); it used to stop the whole ingest with a
``UnicodeEncodeError``. For every example and spec log with such values, a copy of a request
line with one added must read as the log itself plus that line, counted once as rejected.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.ingest import IngestOptions
from pipeline.ingest.reprs import NotACharacterError, check_text, decode_python_str
from tests.unit.ingest.alike import FILES, assert_read_alike, read_pair

OPTIONS = IngestOptions(year=2025)
#: where a value is decoded, and what makes it no text there, by kind of log
_TGI = [  # the adapter in a span's quoted parameters: escaped twice in text, once in JSON
    (b'adapter_id: Some(\\"', b'adapter_id: Some(\\"\\\\u{d800}'),
]
_TGI_JSON = [
    (b'adapter_id: Some(\\"', b'adapter_id: Some(\\"\\\\u{dfff}'),
    (b'adapter_id: Some(\\"', b'adapter_id: Some(\\"\\ud800'),  # a JSON escape
]
_VLLM = [(b"prompt: '", b"prompt: '\\udc80"), (b"prompt: '", b"prompt: '\\U00110000")]


def _mends(path: Path) -> list[tuple[bytes, bytes]]:
    if path.suffix == ".jsonl":
        return _TGI_JSON
    return _TGI if path.name.startswith("tgi") else _VLLM


def _cases() -> list[tuple[Path, bytes, bytes]]:
    cases = []
    for path in FILES:
        data = path.read_bytes()
        cases += [(path, old, new) for old, new in _mends(path) if old in data]
    return cases


CASES = [pytest.param(*case, id=f"{case[0].name}-{case[2][-6:].decode()}") for case in _cases()]


@pytest.mark.parametrize(("path", "old", "new"), CASES)
def test_a_request_line_with_a_value_that_is_no_text_is_one_reject(
    tmp_path: Path, path: Path, old: bytes, new: bytes
) -> None:
    lines = path.read_bytes().split(b"\n")
    at = next(i for i, line in enumerate(lines) if old in line)
    bad = lines[at].replace(old, new, 1)
    changed = b"\n".join([*lines[: at + 1], bad, *lines[at + 1 :]])
    dirty, clean = read_pair(tmp_path, path.name, path.read_bytes(), changed, OPTIONS)
    assert_read_alike(dirty, clean, extra_rejects=1)


def test_the_cases_cover_both_engines() -> None:
    names = {path.name.split("-")[0] + path.suffix for path, _, _ in _cases()}
    assert {"vllm.txt", "tgi.txt", "tgi.jsonl"} <= names


@pytest.mark.parametrize("literal", ["'\\ud800'", "'a\\udfffb'", "'\\U00110000'"])
def test_a_printed_string_escaping_no_character_is_an_error(literal: str) -> None:
    with pytest.raises(NotACharacterError):
        decode_python_str(literal)


def test_surrogate_pairs_and_other_text_pass() -> None:
    check_text(["plain", "é€😀", None, 3, decode_python_str("'\\U0001f600'")])
    with pytest.raises(NotACharacterError):
        check_text(["ok", "a\ud800"])
