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


@dataclass(frozen=True)
class _Requests:
    """What each record adds to its items' counts, by position: its window's start
    (microseconds since the epoch; ``timed``: it has a time, else it falls in no window) and
    its tokens (missing: 0); with ``timing``, its offset into the window and whether it came in
    the window's tail."""

    starts: np.ndarray
    timed: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    offsets: np.ndarray | None = None
    tail: np.ndarray | None = None


def _requests(records: pd.DataFrame, window: str, timing: bool) -> _Requests:
    ts = pd.to_datetime(records["ts"], utc=True)
    floor = ts.dt.floor(window)
    starts, timed = _window_numbers(floor)
    requests = _Requests(starts, timed, _tokens(records["prompt_tokens"]),
                         _tokens(records["output_tokens"]))  # fmt: skip
    if not timing:
        return requests
    offsets = (ts - floor).dt.total_seconds().to_numpy(dtype=np.float64)
    tail_start = pd.Timedelta(window).total_seconds() * (1 - TAIL_FRACTION)
    tail = (offsets >= tail_start).astype(np.int64)
    return _Requests(starts, timed, requests.prompt_tokens, requests.output_tokens, offsets, tail)


def _tokens(values: pd.Series) -> np.ndarray:
    return pd.to_numeric(values).fillna(0).astype("int64").to_numpy()


def _window_numbers(starts: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Window starts as microseconds since the epoch, and where there is one (not ``NaT``)."""
    micros = pc.cast(pa.array(starts), pa.timestamp("us", tz="UTC"))
    timed = micros.is_valid().to_numpy(zero_copy_only=False)
    return pc.fill_null(pc.cast(micros, pa.int64()), 0).to_numpy(), timed


def _table_requests(table: pa.Table, window: str) -> _Requests:
    """:func:`_requests` of a records table: its times floored as pandas floors them, on
    numbers (no frame)."""
    micros = pc.cast(_one_array(table.column("ts")), pa.int64())
    timed = micros.is_valid().to_numpy(zero_copy_only=False)
    values = pc.fill_null(micros, 0).to_numpy()
    starts = pd.DatetimeIndex(values.view("datetime64[us]")).floor(window).asi8
    tokens = [pc.fill_null(table.column(c), 0).to_numpy() for c in _TOKENS]
    return _Requests(starts, timed, *tokens)


_TOKENS = ("prompt_tokens", "output_tokens")


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
        return _text_items(kind, _arrow_text(keys))
    keep = keys.notna().to_numpy(dtype=bool)
    values = keys[keep].astype(str).to_numpy(dtype=object)
    return _Items(kind, np.flatnonzero(keep), pa.array(values, pa.string()))


def _text_items(kind: str, text: pa.Array) -> _Items:
    """One row per present value of ``text``, keyed by the value itself."""
    rows, present = _present(text)
    return _Items(kind, rows, present.cast(pa.string()))


def _arrow_text(values: pd.Series) -> pa.Array:
    """A column of text as one Arrow array."""
    text = pa.array(values.astype("string"))
    return text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text


def _present(text: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """The positions of ``text`` that are not missing, and their values."""
    valid = text.is_valid()
    present = text.filter(valid) if text.null_count else text
    return np.flatnonzero(valid.to_numpy(zero_copy_only=False)), present


def _present_text(values: pd.Series) -> tuple[np.ndarray, pa.Array]:
    """The positions of ``values`` that are not missing, and their text as one Arrow array."""
    return _present(_arrow_text(values))


def _prompt_items(prompts: pd.Series) -> _Items:
    """One row per prompt, keyed by :func:`prompt_key`: hashed from Arrow's UTF-8 bytes (the
    text's own; no Python string decoded and encoded again: half the cost on 10k prompts)."""
    return _text_prompt_items(_arrow_text(prompts))


def _text_prompt_items(prompts: pa.Array) -> _Items:
    rows, text = _present(prompts)
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
        return _list_lengths(hashes)
    chains = column.tolist()
    lengths = np.fromiter(
        (len(c) if isinstance(c, list | tuple | np.ndarray) else 0 for c in chains),
        dtype=np.int64, count=len(chains),
    )  # fmt: skip
    keys = [str(h) for c, n in zip(chains, lengths.tolist(), strict=True) if n for h in c]
    return lengths, pa.array(keys, pa.string())


def _list_lengths(hashes: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """:func:`_chain_lengths` of Arrow lists."""
    lengths = pc.fill_null(pc.list_value_length(hashes), 0).to_numpy().astype(np.int64)
    return lengths, pc.list_flatten(hashes)


def _prefix_items(column: pd.Series) -> _Items:
    """One row per block hash of every record's chain (``depth``: its place in the chain)."""
    return _chain_items(*_chain_lengths(column))


def _chain_items(lengths: np.ndarray, keys: pa.Array) -> _Items:
    """:func:`_prefix_items` of chains' lengths and their hashes.

    Positional (lists' lengths repeated with numpy): ``Series.explode`` and a label lookup
    with repeated labels cost ~4x more on 200k hashes."""
    rows = np.repeat(np.arange(len(lengths)), lengths)
    position = np.arange(len(rows)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    leaf = (position == lengths[rows] - 1).astype("int64")
    return _Items("prefix", rows, keys, position, leaf)


#: the kinds of item named by a records column of their own
_NAMED_KINDS = ("template", "adapter", "tenant", "model")


def _item_rows(records: pd.DataFrame) -> list[_Items]:
    parts = []
    # a column with no value at all (a log without prompts) costs no per-row pass
    if "prefix_hashes" in records and not records["prefix_hashes"].isna().all():
        parts.append(_prefix_items(records["prefix_hashes"]))
    if "prompt" in records and not records["prompt"].isna().all():
        parts.append(_prompt_items(records["prompt"]))
    for kind in _NAMED_KINDS:
        if kind in records:
            parts.append(_keyed(kind, records[kind]))
    return [p for p in parts if len(p.rows)]


def _table_items(table: pa.Table) -> list[_Items]:
    """:func:`_item_rows` of a records table, from its Arrow columns."""
    wanted = [c for c in ("prefix_hashes", "prompt", *_NAMED_KINDS) if c in table.column_names]
    columns = {name: _one_array(table.column(name)) for name in wanted}
    parts = []
    hashes, prompts = columns.get("prefix_hashes"), columns.get("prompt")
    if hashes is not None and hashes.null_count < len(hashes):
        parts.append(_chain_items(*_list_lengths(hashes)))
    if prompts is not None and prompts.null_count < len(prompts):
        parts.append(_text_prompt_items(prompts))
    parts.extend(_text_items(kind, columns[kind]) for kind in _NAMED_KINDS if kind in columns)
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


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    """A column as one array (its only chunk as it is: combining copies even one)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _item_table(items: list[_Items], requests: _Requests) -> pa.Table:
    """Every item row: its kind (as its place in ``items``), key, window and values."""
    rows = np.concatenate([i.rows for i in items])
    keep = requests.timed[rows]  # a request without a time falls in no window
    columns = {
        "kind": np.repeat(np.arange(len(items), dtype=np.int8), [len(i.rows) for i in items]),
        "item_key": pa.concat_arrays([i.keys for i in items]),
        "window_start": requests.starts[rows],
        "prompt_tokens": requests.prompt_tokens[rows],
        "output_tokens": requests.output_tokens[rows],
    }
    if requests.offsets is not None and requests.tail is not None:
        columns["last_offset_s"] = requests.offsets[rows]
        columns["tail"] = requests.tail[rows]
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
    if records.empty:
        return _schema(timing).empty_table()
    return _counted(_item_rows(records), _requests(records, window, timing), timing, ordered)


def records_window_counts(table: pa.Table, window: str = "10min") -> pa.Table:
    """:func:`window_counts_table` (not ordered) of a records table (the records' Arrow
    schema), read from its Arrow columns: ~0.02 CPU-s less than from the frame it was made of,
    on a 100 MB vLLM log's pieces (no column converted to pandas or back)."""
    if table.num_rows == 0:
        return COUNTS_SCHEMA.empty_table()
    return _counted(_table_items(table), _table_requests(table, window), False, False)


def _counted(items: list[_Items], requests: _Requests, timing: bool, ordered: bool) -> pa.Table:
    """The item rows grouped by kind, key and window: their requests and sums."""
    schema = _schema(timing)
    if not items:
        return schema.empty_table()
    extra = _TIMING_AGGREGATES if timing else []
    grouped = (
        _item_table(items, requests)
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
