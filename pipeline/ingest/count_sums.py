"""Window counts of many chunks summed into one table sorted by item and window.

The counts are sorted first and each run of equal rows (same item and window) is then summed
with numpy: on the 1.5M rows of a 1 GB vLLM log's chunks that costs ~0.2 s of CPU, against
~1.4 s for an Arrow hash group-by and a sort. The sort itself runs on one integer a row (the
item kind's rank and the key's first bytes), in Arrow's order of strings; only rows sharing
that integer with another row are ordered by Arrow (28k of those 1.5M: hex keys differ early,
and an item seen in several windows has one integer)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.windows import COUNTS_SCHEMA

COUNT_KEYS = ["item_kind", "item_key", "window_start"]
COUNT_VALUES = ["requests", "prompt_tokens", "output_tokens"]
_ASCENDING = [(k, "ascending") for k in COUNT_KEYS]
#: bytes of a key in its row's integer: the eighth holds the kind's rank
_KEY_BYTES = 7
_MAX_KINDS = 256


def sum_counts(tables: list[pa.Table]) -> pa.Table:
    """Sum counts tables (:data:`COUNTS_SCHEMA`) of several chunks: one row per item and
    window, values added, sorted by item kind, key and window."""
    tables = [t.select(COUNTS_SCHEMA.names).cast(COUNTS_SCHEMA) for t in tables if t.num_rows]
    if not tables:
        return COUNTS_SCHEMA.empty_table()
    counts = pa.concat_tables(tables)
    kinds = _sorted_kinds(counts.column("item_kind"))
    if kinds is None or any(counts.column(k).null_count for k in COUNT_KEYS):
        return _grouped(counts)
    return _runs_summed(counts, _sorted(counts, kinds))


def _grouped(counts: pa.Table) -> pa.Table:
    """:func:`sum_counts` by Arrow's hash group-by (a missing key is a key of its own)."""
    grouped = counts.group_by(COUNT_KEYS, use_threads=False).aggregate(
        [(c, "sum") for c in COUNT_VALUES]
    )
    grouped = grouped.rename_columns([n.removesuffix("_sum") for n in grouped.column_names])
    return grouped.select(COUNTS_SCHEMA.names).cast(COUNTS_SCHEMA).sort_by(_ASCENDING)


def _sorted_kinds(kinds: pa.ChunkedArray) -> pa.Array | None:
    """The distinct kinds, sorted (``None``: more than a row's integer holds)."""
    distinct = pc.unique(kinds)
    return distinct.take(pc.sort_indices(distinct)) if len(distinct) <= _MAX_KINDS else None


@dataclass(frozen=True)
class _Sorted:
    """Counts rows sorted by kind, key and window: the rows' positions (``order``) and, in
    that order, their integers (``coarse``: kind rank, then the key's first bytes) and
    windows (microseconds)."""

    kinds: pa.Array
    order: np.ndarray
    coarse: np.ndarray
    windows: np.ndarray


def _sorted(counts: pa.Table, kinds: pa.Array) -> _Sorted:
    """``counts`` sorted by their integers, a coarser order than Arrow's (string bytes
    compared, a shorter prefix first); rows tied on it are sorted by Arrow."""
    ranks = pc.index_in(counts.column("item_kind"), value_set=kinds).to_numpy()
    leading = np.concatenate([_leading_bytes(c) for c in counts.column("item_key").chunks])
    coarse = (ranks.astype(np.uint64) << np.uint64(8 * _KEY_BYTES)) | leading
    order = np.argsort(coarse)  # not stable (a fifth of the time): ties are ordered below
    coarse = coarse[order]
    tied = np.zeros(len(order), dtype=bool)
    tied[1:] = coarse[1:] == coarse[:-1]
    tied[:-1] |= tied[1:]
    if tied.any():  # each run of tied rows is contiguous: Arrow's order of them fills it
        rows = order[tied]
        exact = pc.sort_indices(counts.select(COUNT_KEYS).take(rows), sort_keys=_ASCENDING)
        order[tied] = rows[exact.to_numpy()]
    windows = counts.column("window_start").cast(pa.int64()).to_numpy()[order]
    return _Sorted(kinds, order, coarse, windows)


def _leading_bytes(keys: pa.Array) -> np.ndarray:
    """The first :data:`_KEY_BYTES` bytes of each string as a big-endian integer (a shorter
    string padded with zero bytes)."""
    offsets = np.frombuffer(keys.buffers()[1], np.int32)[keys.offset : keys.offset + len(keys) + 1]
    data = keys.buffers()[2]
    chars = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    last = max(len(chars) - 1, 0)
    chars = chars if len(chars) else np.zeros(1, np.uint8)
    leading = np.zeros(len(keys), dtype=np.uint64)
    for i in range(_KEY_BYTES):
        byte = np.where(lengths > i, chars[np.minimum(starts + i, last)], 0)
        leading = (leading << np.uint64(8)) | byte.astype(np.uint64)
    return leading


def _runs_summed(counts: pa.Table, rows: _Sorted) -> pa.Table:
    """``counts`` in sorted order, each run of rows with equal keys summed into one: kinds
    and windows come from the sorted integers, only the keys are gathered from ``counts``."""
    first = _run_starts(counts, rows)
    ranks = rows.coarse[first] >> np.uint64(8 * _KEY_BYTES)
    columns = [
        rows.kinds.take(pa.array(ranks)),
        _taken_keys(counts.column("item_key"), rows.order[first], ranks),
        pa.array(rows.windows[first]).cast(COUNTS_SCHEMA.field("window_start").type),
    ]
    for name in COUNT_VALUES:
        values = counts.column(name).to_numpy()[rows.order]
        columns.append(pa.array(np.add.reduceat(values, first)))
    return pa.Table.from_arrays(columns, schema=COUNTS_SCHEMA)


def _run_starts(counts: pa.Table, rows: _Sorted) -> np.ndarray:
    """Positions in the sorted order where a new item and window begins."""
    coarse, windows, order = rows.coarse, rows.windows, rows.order
    maybe = np.flatnonzero((coarse[1:] == coarse[:-1]) & (windows[1:] == windows[:-1])) + 1
    if len(maybe):  # the same kind, key bytes and window: the same item if the keys are equal
        keys = counts.column("item_key")
        same = pc.equal(keys.take(order[maybe]), keys.take(order[maybe - 1]))
        maybe = maybe[same.to_numpy(zero_copy_only=False)]
    first = np.ones(len(order), dtype=bool)
    first[maybe] = False
    return np.flatnonzero(first)


def _taken_keys(keys: pa.ChunkedArray, rows: np.ndarray, ranks: np.ndarray) -> pa.Array:
    """``keys.take(rows)``, ``ranks`` (each taken row's kind rank) sorted. A kind whose keys
    are all of one width (block hashes and prompt keys: 16 hex digits) has them gathered as the
    rows of a byte matrix by numpy: ~0.02 CPU-s for a 1 GB vLLM log's 1.5M summed rows, ~0.1
    or more by Arrow's take of strings in random order."""
    if keys.null_count or sum(_text_bytes(c) for c in keys.chunks) >= 2**31:
        return keys.take(rows)  # (more text than one array's offsets reach)
    whole = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    data = whole.buffers()[2]
    if data is None:
        return keys.take(rows)
    bounds = np.frombuffer(whole.buffers()[1], np.int32)
    offsets = bounds[whole.offset : whole.offset + len(whole) + 1]
    widths = np.diff(offsets)[rows]
    edges = [0, *(np.flatnonzero(np.diff(ranks)) + 1).tolist(), len(rows)]
    parts = []
    for begin, end in pairwise(edges):
        kind_rows, width = rows[begin:end], int(widths[begin])
        taken = None
        if width and (widths[begin:end] == width).all():
            taken = _fixed_width_taken(data, offsets[kind_rows], width)
        parts.append(whole.take(kind_rows) if taken is None else taken)
    return pa.concat_arrays(parts)


def _text_bytes(text: pa.Array) -> int:
    data = text.buffers()[2]
    return 0 if data is None else data.size


def _fixed_width_taken(data: pa.Buffer, starts: np.ndarray, width: int) -> pa.Array | None:
    """The strings of ``width`` bytes at ``starts`` of ``data``, gathered as rows of one byte
    matrix (``None``: not all on its rows)."""
    first = int(starts[0]) % width
    if ((starts - first) % width).any():
        return None
    chars = np.frombuffer(data, np.uint8)
    count = (len(chars) - first) // width
    matrix = chars[first : first + count * width].reshape(count, width)
    taken = matrix.take(starts // width, axis=0)
    offsets = np.arange(0, width * (len(starts) + 1), width, dtype=np.int32)
    return pa.StringArray.from_buffers(len(starts), pa.py_buffer(offsets), pa.py_buffer(taken))
