"""Sliding windows: what each warmable item saw per time window (the features of its past are
:mod:`pipeline.window_features`).

**Counts shape** (long format, one row per item and window with at least one request):

=============  ========================  =====================================================
column         dtype                     meaning
=============  ========================  =====================================================
item_kind      string                    ``prefix | prompt | template | adapter | tenant |
                                         model``
item_key       string                    the item's stable key (a block hash, a prompt hash,
                                         an adapter name, ...)
window_start   datetime64[us, UTC]       start of the window (``ts`` floored to the window)
requests       int64                     requests that used the item in the window
prompt_tokens  int64                     sum of their prompt tokens (missing counts as 0)
output_tokens  int64                     sum of their output tokens (missing counts as 0)
=============  ========================  =====================================================

``item_window_counts(..., timing=True)`` adds four optional columns (the evaluation and the
forecaster use them when present; every table without them stays valid):

=================  =========  =================================================================
last_offset_s      float64    seconds from the window start to the item's last request in it
tail_requests      int64      requests in the last fifth of the window
chain_depth        int64      smallest position of a prefix block in its chain (0 = chain head;
                              0 for other kinds)
leaf_requests      int64      requests whose chain ends with this block
=================  =========  =================================================================

A request counts once for *each* block hash of its ``prefix_hashes`` chain (it would have used
every one of those cached blocks). ``prompt`` items are keyed by a hash of the full prompt
text; ``template`` items exist only when the records carry a ``template`` column.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.records import arrow_hashes

ITEM_KINDS = ("prefix", "prompt", "template", "adapter", "tenant", "model")
COUNT_DTYPES = {
    "item_kind": "string",
    "item_key": "string",
    "window_start": "datetime64[us, UTC]",
    "requests": "int64",
    "prompt_tokens": "int64",
    "output_tokens": "int64",
}
KEYS = ["item_kind", "item_key"]
TIMING_DTYPES = {
    "last_offset_s": "float64",
    "tail_requests": "int64",
    "chain_depth": "int64",
    "leaf_requests": "int64",
}
#: the "tail" of a window for ``tail_requests``: its last fifth (recent activity within it)
TAIL_FRACTION = 0.2
#: bytes of a prompt key's digest (16 hex digits)
_KEY_BYTES = 8


def prompt_key(prompt: str) -> str:
    """Stable key of a whole prompt text (16 hex digits)."""
    return _utf8_key(prompt.encode("utf-8", "surrogatepass"))


def _utf8_key(text: bytes) -> str:
    """:func:`prompt_key` of a prompt's UTF-8 bytes."""
    return hashlib.blake2b(text, digest_size=_KEY_BYTES).hexdigest()


def empty_counts() -> pd.DataFrame:
    """A counts frame with no rows and the right dtypes."""
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in COUNT_DTYPES.items()})


def _base(records: pd.DataFrame, window: str) -> pd.DataFrame:
    ts = pd.to_datetime(records["ts"], utc=True)
    return pd.DataFrame(
        {
            "window_start": ts.dt.floor(window),
            "prompt_tokens": pd.to_numeric(records["prompt_tokens"]).fillna(0).astype("int64"),
            "output_tokens": pd.to_numeric(records["output_tokens"]).fillna(0).astype("int64"),
        },
        index=records.index,
    )


def _with_timing(base: pd.DataFrame, records: pd.DataFrame, window: str) -> pd.DataFrame:
    """Adds the per-request timing columns the ``timing=True`` aggregation sums."""
    ts = pd.to_datetime(records["ts"], utc=True)
    offset = (ts - base["window_start"]).dt.total_seconds()
    tail_start = pd.Timedelta(window).total_seconds() * (1 - TAIL_FRACTION)
    return base.assign(
        last_offset_s=offset, tail=(offset >= tail_start).astype("int64"), depth=0, leaf=0
    )


@dataclass(frozen=True)
class _Items:
    """The item rows of one kind: the record (by position) each comes from and its key, and
    for prefix blocks their place in the chain (``depth``) and whether it ends it (``leaf``)."""

    kind: str
    rows: np.ndarray
    keys: pa.Array
    depth: np.ndarray | None = None
    leaf: np.ndarray | None = None


def _keyed(kind: str, keys: pd.Series) -> _Items:
    if isinstance(keys.dtype, pd.StringDtype):  # (the records' own): no Python string a row
        rows, text = _present_text(keys)
        return _Items(kind, rows, text.cast(pa.string()))
    keep = keys.notna().to_numpy(dtype=bool)
    values = keys[keep].astype(str).to_numpy(dtype=object)
    return _Items(kind, np.flatnonzero(keep), pa.array(values, pa.string()))


def _present_text(values: pd.Series) -> tuple[np.ndarray, pa.Array]:
    """The positions of ``values`` that are not missing, and their text as one Arrow array."""
    text = pa.array(values.astype("string"))
    if isinstance(text, pa.ChunkedArray):
        text = text.combine_chunks()
    valid = text.is_valid()
    present = text.filter(valid) if text.null_count else text
    return np.flatnonzero(valid.to_numpy(zero_copy_only=False)), present


def _prompt_items(prompts: pd.Series) -> _Items:
    """One row per prompt, keyed by :func:`prompt_key`: hashed from Arrow's UTF-8 bytes (the
    text's own; no Python string decoded and encoded again: half the cost on 10k prompts)."""
    rows, text = _present_text(prompts)
    return _Items("prompt", rows, _utf8_keys(text))


def _utf8_keys(text: pa.Array) -> pa.Array:
    """:func:`prompt_key` of every string of ``text`` (none missing), as Arrow strings.

    Each prompt is hashed in place, a view of Arrow's buffer, by a copy of one fresh hash (a
    constructor with keywords costs more), and the digests are written as hex at once: on a
    1 GB vLLM log's 440k prompts (~870 bytes each) a quarter less than a bytes object and a
    hex string per prompt; two thirds of what is left is blake2b itself (~1.3 GB/s)."""
    wide = pa.types.is_large_string(text.type) or pa.types.is_large_binary(text.type)
    offsets = np.frombuffer(text.buffers()[1], np.int64 if wide else np.int32)
    bounds = offsets[text.offset : text.offset + len(text) + 1].tolist()
    data = text.buffers()[2]
    utf8 = memoryview(data if data is not None else b"")
    fresh = hashlib.blake2b(digest_size=_KEY_BYTES)
    digests = []
    for start, end in pairwise(bounds):
        key = fresh.copy()
        key.update(utf8[start:end])
        digests.append(key.digest())
    return _hex_strings(b"".join(digests), _KEY_BYTES)


def _hex_strings(digests: bytes, size: int) -> pa.Array:
    """Digests of ``size`` bytes each, back to back, as Arrow strings of hex digits."""
    width = 2 * size
    count = len(digests) // size
    offsets = np.arange(0, width * (count + 1), width, dtype=np.int32)
    return pa.StringArray.from_buffers(
        count, pa.py_buffer(offsets), pa.py_buffer(digests.hex().encode("ascii"))
    )


def _chain_lengths(column: pd.Series) -> tuple[np.ndarray, pa.Array]:
    """Each record's chain length (0: none) and every block hash, chain after chain."""
    hashes = arrow_hashes(column)
    if hashes is not None:  # Arrow lists: no Python object per hash
        lengths = pc.fill_null(pc.list_value_length(hashes), 0).to_numpy().astype(np.int64)
        return lengths, pc.list_flatten(hashes)
    chains = column.tolist()
    lengths = np.fromiter(
        (len(c) if isinstance(c, list | tuple | np.ndarray) else 0 for c in chains),
        dtype=np.int64, count=len(chains),
    )  # fmt: skip
    keys = [str(h) for c, n in zip(chains, lengths.tolist(), strict=True) if n for h in c]
    return lengths, pa.array(keys, pa.string())


def _prefix_items(column: pd.Series) -> _Items:
    """One row per block hash of every record's chain (``depth``: its place in the chain).

    Positional (lists' lengths repeated with numpy): ``Series.explode`` and a label lookup
    with repeated labels cost ~4x more on 200k hashes."""
    lengths, keys = _chain_lengths(column)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    position = np.arange(len(rows)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    leaf = (position == lengths[rows] - 1).astype("int64")
    return _Items("prefix", rows, keys, position, leaf)


def _item_rows(records: pd.DataFrame) -> list[_Items]:
    parts = []
    # a column with no value at all (a log without prompts) costs no per-row pass
    if "prefix_hashes" in records and not records["prefix_hashes"].isna().all():
        parts.append(_prefix_items(records["prefix_hashes"]))
    if "prompt" in records and not records["prompt"].isna().all():
        parts.append(_prompt_items(records["prompt"]))
    for kind in ("template", "adapter", "tenant", "model"):
        if kind in records:
            parts.append(_keyed(kind, records[kind]))
    return [p for p in parts if len(p.rows)]


#: the counts shape (and its timing columns) in Arrow
COUNTS_SCHEMA = pa.schema(
    [("item_kind", pa.string()), ("item_key", pa.string()),
     ("window_start", pa.timestamp("us", tz="UTC")), ("requests", pa.int64()),
     ("prompt_tokens", pa.int64()), ("output_tokens", pa.int64())]
)  # fmt: skip
_TIMING_FIELDS = [("last_offset_s", pa.float64()), ("tail_requests", pa.int64()),
                  ("chain_depth", pa.int64()), ("leaf_requests", pa.int64())]  # fmt: skip
#: what the timing columns aggregate, in their order: (column of the item rows, aggregation)
_TIMING_AGGREGATES = [("last_offset_s", "max"), ("tail", "sum"), ("depth", "min"), ("leaf", "sum")]


def _schema(timing: bool) -> pa.Schema:
    return pa.schema([*COUNTS_SCHEMA, *(_TIMING_FIELDS if timing else [])])


def _window_numbers(base: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Window starts as microseconds since the epoch, and where there is one (not ``NaT``)."""
    starts = pc.cast(pa.array(base["window_start"]), pa.timestamp("us", tz="UTC"))
    valid = starts.is_valid().to_numpy(zero_copy_only=False)
    return pc.fill_null(pc.cast(starts, pa.int64()), 0).to_numpy(), valid


def _item_table(items: list[_Items], base: pd.DataFrame, timing: bool) -> pa.Table:
    """Every item row: its kind (as its place in ``items``), key, window and values."""
    rows = np.concatenate([i.rows for i in items])
    starts, valid = _window_numbers(base)
    keep = valid[rows]  # a request without a time falls in no window
    columns = {
        "kind": np.repeat(np.arange(len(items), dtype=np.int8), [len(i.rows) for i in items]),
        "item_key": pa.concat_arrays([i.keys for i in items]),
        "window_start": starts[rows],
        "prompt_tokens": base["prompt_tokens"].to_numpy()[rows],
        "output_tokens": base["output_tokens"].to_numpy()[rows],
    }
    if timing:
        columns["last_offset_s"] = base["last_offset_s"].to_numpy(dtype=np.float64)[rows]
        columns["tail"] = base["tail"].to_numpy()[rows]
        for name in ("depth", "leaf"):
            values = [np.zeros(len(i.rows), np.int64) if getattr(i, name) is None
                      else getattr(i, name) for i in items]  # fmt: skip
            columns[name] = np.concatenate(values)
    table = pa.table(columns)
    return table if keep.all() else table.filter(pa.array(keep))


def window_counts_table(
    records: pd.DataFrame, window: str = "10min", timing: bool = False, ordered: bool = True
) -> pa.Table:
    """:func:`item_window_counts` as an Arrow table (:data:`COUNTS_SCHEMA`, plus the timing
    columns with ``timing``): grouped by Arrow's hash kernels, ~5x pandas' on the ~900k item
    rows (most of them block hashes) of a 32 MB vLLM chunk."""
    schema = _schema(timing)
    if records.empty:
        return schema.empty_table()
    base = _base(records, window)
    if timing:
        base = _with_timing(base, records, window)
    items = _item_rows(records)
    if not items:
        return schema.empty_table()
    extra = _TIMING_AGGREGATES if timing else []
    grouped = (
        _item_table(items, base, timing)
        .group_by(["kind", "item_key", "window_start"], use_threads=False)  # CPU, not wall
        .aggregate([("prompt_tokens", "count", pc.CountOptions("all")),
                    ("prompt_tokens", "sum"), ("output_tokens", "sum"), *extra])
    )  # fmt: skip
    kinds = pc.take(pa.array([i.kind for i in items]), grouped.column("kind"))
    values = [grouped.column(f"{c}_{how}") for c, how in extra]
    counts = pa.Table.from_arrays(
        [kinds, grouped.column("item_key"),
         pc.cast(grouped.column("window_start"), pa.timestamp("us", tz="UTC")),
         grouped.column("prompt_tokens_count"), grouped.column("prompt_tokens_sum"),
         grouped.column("output_tokens_sum"), *values],
        schema=schema,
    )  # fmt: skip
    return counts.sort_by([(k, "ascending") for k in _SORT_KEYS]) if ordered else counts


_SORT_KEYS = ["item_kind", "item_key", "window_start"]


def item_window_counts(
    records: pd.DataFrame, window: str = "10min", timing: bool = False, ordered: bool = True
) -> pd.DataFrame:
    """Per item and window: requests and token sums (the counts shape; see the module doc).

    ``timing`` adds the optional columns of :data:`TIMING_DTYPES` (within-window recency and
    chain position), which per-window counts alone lose. ``ordered=False`` leaves the rows in
    no particular order (for partial counts summed and sorted later: sorting ~900k rows of a
    200 MB vLLM log's chunks is half the grouping's cost).
    """
    dtypes = {**COUNT_DTYPES, **(TIMING_DTYPES if timing else {})}
    if records.empty:
        return empty_counts().astype(dtypes) if timing else empty_counts()
    counts = window_counts_table(records, window, timing, ordered)
    if counts.num_rows == 0:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in dtypes.items()})
    return counts.to_pandas().astype(dtypes)
