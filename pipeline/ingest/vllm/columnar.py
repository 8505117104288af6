"""The access lines of served requests in a vLLM log block, found column-wise by RE2.

A vLLM log prints a uvicorn access line for every request; one of a served request (status
below 400) adds nothing to its record (the request is joined by its id) and is only counted.
The per-line path reads each with a Python regular expression (1.5-1.7 µs a line: ~0.07 s for
the 43k of a generated 100 MB log); one RE2 pass over the blocks' bytes finds them all in
~0.03 s. What the other lines hold is cut by Python's string methods from the lines the
reader decoded already: Arrow has to copy the prompts out of the block and a Python string of
each is built again, which costs more than the cut (a column-wise reader of the request lines
took 0.48 s of Arrow calls on a generated 100 MB log, and the parse without hashing went from
0.66 to 0.69 CPU-s).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest.lines import binary_lines

#: Python's ``\\s`` on ASCII text (RE2's ``\\s`` lacks ``\\v`` and ``\\x1c``-``\\x1f``)
_SPACE = r"\t\n\x0b\x0c\r\x1c-\x1f "
_CODES = r"(?:\x1b\[[0-9;]*m)*"
#: an ASCII uvicorn access line with a status below 400, as the per-line path's pattern reads
#: it (colour codes only before it, none after it)
_ACCESS_OK = (
    rf"^{_CODES}(?:\([^()\x1b]+ pid=[0-9]+\){_CODES} )?{_CODES}[A-Z]+:[{_SPACE}]+"
    rf'[^{_SPACE}\x1b]* - "[A-Z]+ [^{_SPACE}\x1b]+ HTTP/[0-9.]+" [0-3][0-9][0-9][^\x1b]*\n$'
)


def served_access_lines(lines: Sequence[str]) -> np.ndarray | None:
    """Where a block's lines are access lines of served requests, as the per-line path reads
    them (a boolean per line); None when the block cannot be put in Arrow (a lone
    surrogate)."""
    try:
        raw = binary_lines(lines)  # each with its newline: the patterns end with it
    except UnicodeEncodeError:
        return None
    found = np.array(pc.match_substring_regex(raw, _ACCESS_OK), dtype=bool)
    rows = np.flatnonzero(found)
    ascii_only = pc.string_is_ascii(raw.take(rows).view(pa.string()))
    found[rows[~ascii_only.to_numpy(zero_copy_only=False)]] = False
    return found
