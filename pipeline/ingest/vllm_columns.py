"""The envelopes of a block of vLLM lines, read column-wise by Arrow's RE2 kernels.

:class:`pipeline.ingest.vllm.VllmChunkParser` hands a block of lines here and gets back, per
line, whether it starts with the usual ``INFO`` envelope (colour codes only around the
``(APIServer pid=N)`` tag and before the level) and, where it does, where its message starts
and its time; the parser then reads the message without matching the envelope again. Every
other line goes through the parser's per-line path (the reference).

Only the head of a line is read (the envelope is a tag, a few codes and ~60 characters). On
the benchmark's 50 MB log (2 kB request lines) this costs 0.12 CPU-s, against 0.16 s for the
per-line envelope match and message cut it replaces; a further RE2 pass over whole lines (the
shape of a ``Received request`` line, its keys) costs 0.05-0.1 s each, about what the Python
work it would save costs, so none is made. The pattern is the parser's own with ASCII classes
in place of Python's Unicode ``\\d`` and "anything but": a line it matches, the parser's
pattern matches the same way (``tests/unit/ingest/test_columnar.py`` checks that both paths
agree on every vLLM example and golden file, and with garbage between and inside the lines).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc

from pipeline.ingest.lines import arrow_lines

OTHER, ENVELOPED = 0, 1

_CODES = r"(?:\x1b\[[0-9;]*m)*"
_TAG = r"(?:\([^()\x1b]+ pid=[0-9]+\)" + _CODES + " )?"
#: the envelope is at most a tag, a few codes and ~60 characters: read from the head only
_HEAD_CHARS = 256
ENVELOPE = (
    "^(?P<env>" + _CODES + _TAG + _CODES
    + r"INFO (?P<ts>[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}) \[?[A-Za-z0-9_./-]+:[0-9]+\] )"
)  # fmt: skip


@dataclass(frozen=True)
class LineKinds:
    """Per line of a block: its kind, where its message starts and its time (text); the last
    two are 0 and "" on ``OTHER`` lines."""

    kinds: np.ndarray
    message_at: list[int]
    ts: list[str]


def line_kinds(lines: Sequence[str]) -> LineKinds:
    """Classify ``lines`` by their heads (see the module docstring)."""
    array = arrow_lines(lines)
    found = pc.extract_regex(pc.utf8_slice_codeunits(array, 0, _HEAD_CHARS), ENVELOPE)
    kinds = np.where(pc.is_valid(found).to_numpy(zero_copy_only=False), ENVELOPED, OTHER)
    message_at = pc.fill_null(pc.utf8_length(pc.struct_field(found, "env")), 0)
    ts = pc.fill_null(pc.struct_field(found, "ts"), "")
    return LineKinds(kinds.astype(np.int8), message_at.to_pylist(), ts.to_pylist())
