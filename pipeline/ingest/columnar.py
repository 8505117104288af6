"""The common lines of a block, read column-wise by Arrow's compute kernels (RE2 regular
expressions, casts, arithmetic) instead of one Python call per line.

A parser hands a block of decoded lines to a reader here; the reader returns a mask of the
lines it read and their fields as columns. Lines it does not read (rare shapes, garbage,
events that depend on state such as a pending ``Input:``) go through the parser's per-line
Python path, which stays the reference: for every line read here the result is the one that
path would give (``tests/unit/ingest/test_columnar.py`` checks it line by line).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest.lines import arrow_lines
from pipeline.ingest.reprs import NotACharacterError

# A TGI ``Success`` event on one line, in the shape the router prints it (FORMATS.md 2.4): a
# handler span with its parameters (quoted or raw Debug, or none) and the six fields TGI
# declares, in its order. Each part is read in its own cut of the line, cut at the end of the
# time (27 characters) and at the line's last 12 double quotes (the fields' quotes, found by
# numpy for the whole block at once):
#   <time><_HANDLER: level, span, parameters><_SPAN_FIELDS: 'total_time="' to the seed's
#   value><_SUCCESS_END: the seed's closing quote to "Success">
# RE2 reads ~3 ns a byte and ~100 ns a value, whatever the pattern (0.19 s for one pattern over
# the whole lines of 100 MB): the handler and parameters (3/4 of a line) and the end are read
# once per distinct text (hashing them costs ~0.1 ns a byte), the time by numpy, and only the
# fields (1/5 of a line) by RE2 line by line. Any other line goes through the Python path.
#: an event time as the router prints it, UTC to the microsecond: each character between
#: these two (digits where they have 0 and 9, the same character elsewhere)
TIME_LOW = np.frombuffer(b"0000-00-00T00:00:00.000000Z", np.uint8)
TIME_HIGH = np.frombuffer(b"9999-99-99T99:99:99.999999Z", np.uint8)
#: the level, the handler span and its parameters (if printed): a quoted Rust string or a
#: ``GenerateParameters`` Debug text
_HANDLER = (
    r"^ +INFO (?P<span>chat_completions|completions|compat_generate|generate|generate_stream)"
    r'\{(?:parameters=(?P<params>"[^"\\]*(?:\\.[^"\\]*)*"|GenerateParameters \{[^{}]*\}) )?$'
)
_DURATION = r"\d+(?:\.\d+)?(?:ns|µs|us|ms|s)"
#: the timing fields and the seed, from ``total_time``'s name to the seed's value
_SPAN_FIELDS = (
    rf'^total_time="{_DURATION}" validation_time="{_DURATION}" queue_time="{_DURATION}" '
    rf'inference_time="{_DURATION}" time_per_token="{_DURATION}" seed="(?:Some\(\d{{1,20}}\)|None)$'
)
#: the seed's closing quote, the span's end, the child spans, target and file, the message
_SUCCESS_END = r'^"\}(?::\w+)*: [\w:]+: [\w/.-]+\.rs:\d+: Success$'
#: the quotes of the six fields, the last of the line (``_SUCCESS_END`` holds none)
_FIELD_QUOTES = 12
_TOTAL_TIME = 'total_time="'
#: each value's quotes, by its index among the fields' quotes
_VALUE_QUOTES = {
    "total_time": 0, "queue_time": 4, "inference_time": 6, "time_per_token": 8, "seed": 10,
}  # fmt: skip
#: the timings a record takes (``validation_time`` is only checked)
_TIMINGS = ("total_time", "queue_time", "inference_time", "time_per_token")
_TIME_WIDTH = len(TIME_LOW)
_UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_UNIT_NAMES = pa.array(list(_UNITS))
_FACTORS = pa.array(list(_UNITS.values()), pa.float64())
_U64_MAX = "18446744073709551615"


def arrow_to_pandas(values: pa.Array, dtype: str) -> pd.api.extensions.ExtensionArray:
    """An Arrow array as the pandas extension array of ``dtype`` ("Float64", "string" ...),
    without a Python object per value."""
    return pd.api.types.pandas_dtype(dtype).__from_arrow__(values)


def typed_values(values: list[object], dtype: str) -> object:
    """Python values as a pandas array of ``dtype``; unsigned 64-bit values through Arrow,
    exactly (pandas reads a list mixing values below and above 2**63 through float64)."""
    if dtype == "UInt64":
        return arrow_to_pandas(pa.array(values, pa.uint64()), dtype)
    return pd.array(values, dtype=dtype)


def durations_s(text: pa.Array) -> pa.Array:
    """Rust ``Duration`` Debug texts (``_DURATION``, checked before) in seconds: number times
    its unit, cut by trimming."""
    number = pc.utf8_rtrim(text, characters="nsµum")
    unit = pc.utf8_ltrim(text, characters="0123456789.")
    factor = pc.take(_FACTORS, pc.index_in(unit, value_set=_UNIT_NAMES))
    return pc.multiply(pc.cast(number, pa.float64()), factor)


def _seed(text: pa.Array) -> tuple[pa.Array, pa.Array]:
    """The span's ``seed`` (the one the server used): ``Some(<1 to 20 digits>)`` -> the seed,
    ``None`` -> null; and where the number is past 64 bits (the Python path leaves it out:
    such a line goes there). Numbers compared as texts of the same length: no decimal cast."""
    some = pc.starts_with(text, "Some(")
    digits = pc.if_else(some, pc.utf8_slice_codeunits(text, 5, -1), "0")
    length = pc.utf8_length(digits)
    fits = pc.or_(
        pc.less(length, len(_U64_MAX)),
        pc.and_(pc.equal(length, len(_U64_MAX)), pc.less_equal(digits, _U64_MAX)),
    )
    seed = pc.if_else(some, pc.cast(pc.if_else(fits, digits, "0"), pa.uint64()), None)
    return seed, pc.and_(some, pc.invert(fits))


def _flags(values: pa.BooleanArray) -> np.ndarray:
    return values.to_numpy(zero_copy_only=False)


def _offsets(array: pa.StringArray) -> np.ndarray:
    """Where each value of ``array`` starts in its data buffer, and where the last ends."""
    return np.frombuffer(array.buffers()[1], np.int32, len(array) + 1, array.offset * 4)


def _last_quotes(array: pa.StringArray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``array`` with ``count`` double quotes at least, and the positions (in its
    data buffer) of their last ``count``, one row of them each.

    All the quotes of the block found at once by numpy (0.04 s on 100 MB; Arrow's substring
    search and RE2 read ~4 ns a byte: ~0.12 s for ``find_substring`` on the same lines)."""
    offsets = _offsets(array)
    data = np.frombuffer(array.buffers()[2], np.uint8)[offsets[0] : offsets[-1]]
    quotes = np.flatnonzero(data == ord('"')) + offsets[0]
    first = np.searchsorted(quotes, offsets)  # each row's first quote (and the end's)
    rows = np.flatnonzero(np.diff(first) >= count)
    return rows, quotes[first[rows + 1, None] - count + np.arange(count)]


def _cuts(array: pa.StringArray, starts: np.ndarray, stops: np.ndarray) -> pa.StringArray:
    """The bytes ``starts[i]:stops[i]`` of ``array``'s data buffer (cuts in order, none
    overlapping the next) as strings. (A cut that is no whole text of characters is only ever
    matched by RE2, which finds no match in it.)

    An array over the same buffer whose values are the cuts and the gaps between them, of which
    ``take`` copies the cuts only: no copy of whole lines, no search in them."""
    bounds = np.empty(2 * len(starts), np.int32)
    bounds[0::2], bounds[1::2] = starts, stops
    both = pa.StringArray.from_buffers(
        max(len(bounds) - 1, 0), pa.py_buffer(bounds), array.buffers()[2]
    )
    return pc.take(both, pa.array(np.arange(0, len(bounds) - 1, 2)))


#: a string view holds a text of up to 12 bytes in itself, a longer one by where it lies
_INLINE_VIEW = 12


def _views(array: pa.StringArray, starts: np.ndarray, stops: np.ndarray) -> pa.Array:
    """The bytes ``starts[i]:stops[i]`` (more than 12 each) of ``array``'s data buffer as
    string views of it: no copy (0.003 s instead of 0.03 s for the handler texts of 100 MB).

    A view is its length, its first 4 bytes, the index of its buffer and where it starts."""
    data = np.frombuffer(array.buffers()[2], np.uint8)
    views = np.zeros((len(starts), 4), np.int32)
    views[:, 0] = stops - starts
    views[:, 1] = data[starts[:, None] + np.arange(4)].view(np.int32)[:, 0]
    views[:, 3] = starts
    buffers = [None, pa.py_buffer(views), array.buffers()[2]]
    return pa.Array.from_buffers(pa.string_view(), len(starts), buffers)


def router_times(chars: np.ndarray) -> np.ndarray:
    """Which rows of ``chars`` (27 bytes a row) are event times of the router's shape."""
    return np.all((chars >= TIME_LOW) & (chars <= TIME_HIGH), axis=1)


def _per_distinct(text: pa.Array, check: Callable[[pa.Array], pa.Array]) -> np.ndarray:
    """``check`` (texts -> booleans) run once per distinct value of ``text`` (the same line
    ends repeat: hashing them costs ~0.1 ns a byte), spread to every row."""
    encoded = pc.dictionary_encode(text)
    passed = pc.fill_null(check(encoded.dictionary), False)
    return _flags(pc.take(passed, encoded.indices))


def _success_end(ends: pa.Array) -> pa.Array:
    """Line ends (from the seed's closing quote) that end the span and say ``Success``."""
    return pc.match_substring_regex(ends, _SUCCESS_END)


def _handlers(texts: pa.StringArray) -> tuple[pa.Array, pa.Array, np.ndarray, np.ndarray]:
    """The span names and parameters of handler texts (:data:`_HANDLER`), which print
    parameters, and which are plain: read as the Python path reads them (not empty: ``""``
    gives no parameter fields there; without ANSI codes: the Python path strips them)."""
    found = pc.extract_regex(texts, _HANDLER)
    params = pc.struct_field(found, "params")
    odd = pc.or_(pc.equal(params, '""'), pc.match_substring(texts, "\x1b"))
    plain = pc.fill_null(pc.invert(odd), False)
    printed = pc.fill_null(pc.not_equal(params, ""), False)
    return pc.struct_field(found, "span"), params, _flags(printed), _flags(plain)


def by_unique(
    values: pa.Array, parse: Callable[[str], dict[str, Any]], columns: dict[str, pa.DataType]
) -> tuple[dict[str, pa.Array], np.ndarray]:
    """``parse`` applied once per distinct value (clients repeat their parameters), spread
    back to every row: ``column -> values`` (null where the row's value is null), and the rows
    whose value holds no valid text (:class:`~pipeline.ingest.reprs.NotACharacterError`: the
    per-line path rejects their lines). A dictionary array's values no row holds are not
    parsed."""
    encoded = pc.dictionary_encode(values)
    held = np.zeros(len(encoded.dictionary), dtype=bool)
    held[pc.drop_null(encoded.indices).to_numpy()] = True
    parsed: list[dict[str, Any]] = []
    unreadable: list[bool] = []
    for value, used in zip(encoded.dictionary.to_pylist(), held.tolist(), strict=True):
        try:
            parsed.append(parse(value) if used else {})
        except NotACharacterError:
            parsed.append({})
            unreadable.append(True)
        else:
            unreadable.append(False)
    spread = {
        column: pc.take(pa.array([p.get(column) for p in parsed], kind), encoded.indices)
        for column, kind in columns.items()
    }
    rows = pc.take(pa.array(unreadable, pa.bool_()), encoded.indices)
    return spread, pc.fill_null(rows, False).to_numpy(zero_copy_only=False)


@dataclass(frozen=True)
class _Candidates:
    """Lines of a block that may be plain ``Success`` events: their indices, where they start
    and the positions of their fields' 12 quotes (in the block's data buffer). (numpy arrays:
    a line dropped costs no copy of its texts)"""

    rows: np.ndarray
    starts: np.ndarray
    quotes: np.ndarray

    def only(self, keep: np.ndarray) -> _Candidates:
        return _Candidates(self.rows[keep], self.starts[keep], self.quotes[keep])

    def time_end(self) -> np.ndarray:
        return self.starts + _TIME_WIDTH

    def fields_start(self) -> np.ndarray:
        """Where ``total_time="`` starts, if it ends at the first of the fields' quotes."""
        return self.quotes[:, 0] - (len(_TOTAL_TIME) - 1)

    def value(self, array: pa.StringArray, name: str) -> pa.StringArray:
        """A field's value (between its quotes)."""
        at = _VALUE_QUOTES[name]
        return _cuts(array, self.quotes[:, at] + 1, self.quotes[:, at + 1])


def tgi_success_rows(
    lines: Sequence[str],
    decode_params: Callable[[str], str],
    params_fields: Callable[[str], dict[str, Any]],
    endpoints: dict[str, str],
) -> tuple[np.ndarray, pd.DataFrame | None]:
    """Which of ``lines`` are plain ``Success`` events, and their record heads (``_line`` is
    the index in ``lines``; the caller shifts it)."""
    array = arrow_lines(lines)
    found = _success_shapes(array)
    if not len(found.rows):
        return np.zeros(len(lines), dtype=bool), None
    handler = pc.dictionary_encode(_views(array, found.time_end(), found.fields_start()))
    spans, params, printed, plain = _handlers(handler.dictionary.cast(pa.string()))
    which = handler.indices.to_numpy()  # (never null)
    found, which = found.only(plain[which]), which[plain[which]]
    if not len(found.rows):
        return np.zeros(len(lines), dtype=bool), None
    ts = _cuts(array, found.starts, found.time_end())
    span = pc.take(spans, pa.array(which))
    # (the distinct parameters are parsed once; null where none are printed)
    params = pa.DictionaryArray.from_arrays(pa.array(which, mask=~printed[which]), params)
    timings = {name: durations_s(found.value(array, name)) for name in _TIMINGS}
    seed, past_u64 = _seed(found.value(array, "seed"))
    frame, unreadable = _success_frame(
        ts, span, params, timings, seed, decode_params, params_fields, endpoints
    )
    read = ~(_flags(past_u64) | unreadable)
    frame["_line"] = found.rows
    taken = np.zeros(len(lines), dtype=bool)
    taken[found.rows[read]] = True
    return taken, frame[read].reset_index(drop=True)


def _success_shapes(array: pa.StringArray) -> _Candidates:
    """The lines whose time (:data:`TIME_LOW`), fields (:data:`_SPAN_FIELDS`, after the time
    and more than 12 bytes of handler) and end (:data:`_SUCCESS_END`) read: all but their
    handler."""
    if array.buffers()[2] is None:  # (empty lines only)
        none = np.zeros(0, np.int64)
        return _Candidates(none, none, np.zeros((0, _FIELD_QUOTES), np.int64))
    rows, quotes = _last_quotes(array, _FIELD_QUOTES)
    found = _Candidates(rows, _offsets(array)[rows], quotes)
    found = found.only(found.time_end() + _INLINE_VIEW < found.fields_start())
    data = np.frombuffer(array.buffers()[2], np.uint8)
    found = found.only(router_times(data[found.starts[:, None] + np.arange(_TIME_WIDTH)]))
    fields = _cuts(array, found.fields_start(), found.quotes[:, -1])
    found = found.only(_flags(pc.match_substring_regex(fields, _SPAN_FIELDS)))
    ends = _cuts(array, found.quotes[:, -1], _offsets(array)[found.rows + 1])
    return found.only(_per_distinct(ends, _success_end))


_PARAM_COLUMNS = {
    "temperature": pa.float64(), "top_p": pa.float64(), "top_k": pa.int64(),
    "max_tokens": pa.int64(), "seed": pa.uint64(), "params_hash": pa.string(),
    "adapter": pa.string(),
}  # fmt: skip


def _success_frame(
    ts: pa.Array,
    span: pa.Array,
    params: pa.Array,
    timings: dict[str, pa.Array],
    seed: pa.Array,
    decode_params: Callable[[str], str],
    params_fields: Callable[[str], dict[str, Any]],
    endpoints: dict[str, str],
) -> tuple[pd.DataFrame, np.ndarray]:
    """The heads of plain ``Success`` lines, and those whose parameters hold no valid text."""
    n = len(ts)
    from_params, unreadable = by_unique(
        params, lambda text: params_fields(decode_params(text)), _PARAM_COLUMNS
    )
    total = timings["total_time"]
    inference, per_token = timings["inference_time"], timings["time_per_token"]
    ratio = pc.divide(inference, pc.if_else(pc.equal(per_token, 0.0), None, per_token))
    rounded = pc.round(ratio, round_mode="half_to_even")
    fits = pc.and_(pc.is_finite(rounded), pc.less(pc.abs(rounded), 2.0**63))  # as as_count
    output = pc.cast(pc.if_else(fits, rounded, None), pa.int64())
    names = pa.array(list(endpoints))
    endpoint = pc.take(pa.array(list(endpoints.values())), pc.index_in(span, value_set=names))
    columns = {
        "ts": (ts, "string"),
        "request_id": (pa.nulls(n, pa.string()), "string"),
        "endpoint": (endpoint, "string"),
        "status": (pa.array(["ok"] * n, pa.string()), "string"),
        "e2e_s": (total, "Float64"),
        "queue_s": (timings["queue_time"], "Float64"),
        "_ts_minus_s": (pc.fill_null(total, 0.0), "Float64"),
        "output_tokens": (output, "Int64"),
        "temperature": (from_params["temperature"], "Float64"),
        "top_p": (from_params["top_p"], "Float64"),
        "top_k": (from_params["top_k"], "Int64"),
        "max_tokens": (from_params["max_tokens"], "Int64"),
        "params_hash": (from_params["params_hash"], "string"),
        "adapter": (from_params["adapter"], "string"),
        "seed": (from_params["seed"], "UInt64"),  # what the client asked for
        "seed_used": (seed, "UInt64"),
    }
    frame = pd.DataFrame({c: arrow_to_pandas(v, t) for c, (v, t) in columns.items()})
    return frame, unreadable
