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
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest.lines import arrow_lines
from pipeline.ingest.reprs import NotACharacterError

#: a TGI ``Success`` event on one line, in the shape the router prints it (FORMATS.md 2.4):
#: a handler span with quoted timing fields, its parameters (quoted or raw Debug) first
TGI_SUCCESS = (
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z +INFO "
    r"(?:chat_completions|completions|compat_generate|generate|generate_stream)\{"
    r'(?:parameters=(?:"[^"\\]*(?:\\.[^"\\]*)*"|GenerateParameters \{[^{}]*\}) )?'
    r'total_time="[^"\\]*"(?: \w+="[^"\\]*")*\}(?::\w+)*: '
    r"[\w:]+: [\w/.-]+\.rs:\d+: Success$"
)
#: the same line's parts, each read by a short match (RE2 finds a match with its DFA and
#: reads groups only inside it: one pattern with groups over the whole line is ~10x slower)
_HEAD = r"^(?P<ts>[^ ]+) +INFO (?P<span>\w+)\{"
#: the timing fields and the seed after ' total_time="', in the order TGI declares them; a
#: line with another order, an unknown or an empty field goes to the Python path
_TIMINGS = ("total_time", "validation_time", "queue_time", "inference_time", "time_per_token")
_TAIL = (
    r'^(?P<total_time>[^"]+)"(?: validation_time="(?P<validation_time>[^"]+)")?'
    r'(?: queue_time="(?P<queue_time>[^"]+)")?(?: inference_time="(?P<inference_time>[^"]+)")?'
    r'(?: time_per_token="(?P<time_per_token>[^"]+)")?(?: seed="(?P<seed>[^"]+)")?\}'
)
_UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_UNIT_NAMES = pa.array(list(_UNITS))
_FACTORS = pa.array(list(_UNITS.values()), pa.float64())
_DURATION = r"^\d+(?:\.\d+)?(?:ns|µs|us|ms|s)$"
_U64_MAX = Decimal(2**64 - 1)
_ZERO = pa.scalar(Decimal(0), pa.decimal128(20, 0))


def _part(found: pa.Array, name: str) -> pa.Array:
    """Group ``name`` of an extraction, null where the group (or the match) is empty."""
    value = pc.struct_field(found, name)
    return pc.if_else(pc.equal(pc.utf8_length(value), 0), pa.scalar(None, pa.string()), value)


def durations_s(text: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Rust ``Duration`` Debug texts in seconds, and where a present text was not one.

    Checked by a pattern without groups, then cut by trimming: RE2 reads groups ~3x slower."""
    valid = pc.fill_null(pc.match_substring_regex(text, _DURATION), False)
    number = pc.if_else(valid, pc.utf8_rtrim(text, characters="nsµum"), "0")
    unit = pc.utf8_ltrim(text, characters="0123456789.")
    factor = pc.take(_FACTORS, pc.index_in(unit, value_set=_UNIT_NAMES))
    seconds = pc.if_else(valid, pc.multiply(pc.cast(number, pa.float64()), factor), None)
    return seconds, pc.and_kleene(pc.is_valid(text), pc.invert(valid))


def arrow_to_pandas(values: pa.Array, dtype: str) -> pd.api.extensions.ExtensionArray:
    """An Arrow array as the pandas extension array of ``dtype`` ("Float64", "string" ...),
    without a Python object per value."""
    return pd.api.types.pandas_dtype(dtype).__from_arrow__(values)


def _seed(text: pa.Array) -> tuple[pa.Array, pa.Array]:
    """``Some(<u64>)`` -> the seed; ``None`` or absent -> null (the parameters' seed stays);
    anything else -> the Python path."""
    found = pc.extract_regex(text, r"^Some\((?P<v>\d{1,20})\)$")
    digits = pc.if_else(pc.is_valid(found), pc.struct_field(found, "v"), "0")
    exact = pc.cast(digits, pa.decimal128(20, 0))
    fits = pc.and_kleene(pc.is_valid(found), pc.less_equal(exact, pa.scalar(_U64_MAX)))
    seed = pc.if_else(fits, pc.cast(pc.if_else(fits, exact, _ZERO), pa.uint64()), None)
    plain = pc.or_kleene(pc.equal(text, "None"), pc.invert(pc.is_valid(text)))
    return seed, pc.invert(pc.or_kleene(fits, plain))


def _halves(text: pa.Array, marker: str) -> tuple[pa.Array, pa.Array]:
    """What comes before and after the first ``marker`` ("" after when there is none)."""
    marked = pc.binary_join_element_wise(text, marker, "")  # every row has one at least
    parts = pc.split_pattern(marked, marker, max_splits=1)
    after = pc.utf8_slice_codeunits(pc.list_element(parts, 1), 0, -len(marker))
    return pc.list_element(parts, 0), after


def by_unique(
    values: pa.Array, parse: Callable[[str], dict[str, Any]], columns: dict[str, pa.DataType]
) -> tuple[dict[str, pa.Array], np.ndarray]:
    """``parse`` applied once per distinct value (clients repeat their parameters), spread
    back to every row: ``column -> values`` (null where the row's value is null), and the rows
    whose value holds no valid text (:class:`~pipeline.ingest.reprs.NotACharacterError`: the
    per-line path rejects their lines)."""
    encoded = pc.dictionary_encode(values)
    parsed: list[dict[str, Any]] = []
    unreadable: list[bool] = []
    for value in encoded.dictionary.to_pylist():
        try:
            parsed.append(parse(value))
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


def tgi_success_rows(
    lines: Sequence[str],
    decode_params: Callable[[str], str],
    params_fields: Callable[[str], dict[str, Any]],
    endpoints: dict[str, str],
) -> tuple[np.ndarray, pd.DataFrame | None]:
    """Which of ``lines`` are plain ``Success`` events, and their record heads (``_line`` is
    the index in ``lines``; the caller shifts it)."""
    array = arrow_lines(lines)
    mask = pc.match_substring_regex(array, TGI_SUCCESS)
    if not pc.any(mask).as_py():
        return np.zeros(len(lines), dtype=bool), None
    rows = pc.indices_nonzero(mask)
    hits = pc.take(array, rows)
    head = pc.extract_regex(hits, _HEAD)
    # the parameters run from "{parameters=" to the first field (a quote inside them is
    # escaped, so ' total_time="' cannot occur in them)
    # (split, not a pattern with a group: RE2 reads a group over the whole match, ~40x slower)
    before, after = _halves(hits, ' total_time="')
    params = _halves(before, "{parameters=")[1]
    params = pc.if_else(pc.equal(pc.utf8_length(params), 0), None, params)
    tail = pc.extract_regex(after, _TAIL)
    # (per distinct parameters: clients repeat theirs)
    encoded = pc.dictionary_encode(params)
    has_request = pc.take(pc.match_substring(encoded.dictionary, 'request="'), encoded.indices)
    fallback = pc.or_kleene(pc.invert(pc.is_valid(tail)), has_request)
    timings = {}
    for name in _TIMINGS:
        timings[name], bad = durations_s(_part(tail, name))
        fallback = pc.or_kleene(fallback, bad)
    seed, bad_seed = _seed(_part(tail, "seed"))
    fallback = pc.fill_null(pc.or_kleene(fallback, bad_seed), True)
    frame, unreadable = _success_frame(
        head, params, timings, seed, decode_params, params_fields, endpoints
    )
    fallback = fallback.to_numpy(zero_copy_only=False) | unreadable
    frame["_line"] = rows.to_numpy()
    keep = ~fallback
    mask_np = np.zeros(len(lines), dtype=bool)
    mask_np[rows.to_numpy()[keep]] = True
    return mask_np, frame[keep].reset_index(drop=True)


_PARAM_COLUMNS = {
    "temperature": pa.float64(), "top_p": pa.float64(), "top_k": pa.int64(),
    "max_tokens": pa.int64(), "seed": pa.uint64(), "params_hash": pa.string(),
    "adapter": pa.string(),
}  # fmt: skip


def _success_frame(
    head: pa.Array,
    params: pa.Array,
    timings: dict[str, pa.Array],
    seed: pa.Array,
    decode_params: Callable[[str], str],
    params_fields: Callable[[str], dict[str, Any]],
    endpoints: dict[str, str],
) -> tuple[pd.DataFrame, np.ndarray]:
    """The heads of plain ``Success`` lines, and those whose parameters hold no valid text."""
    n = len(head)
    span = pc.struct_field(head, "span")
    from_params, unreadable = by_unique(
        params, lambda text: params_fields(decode_params(text)), _PARAM_COLUMNS
    )
    total = timings["total_time"]
    inference, per_token = timings["inference_time"], timings["time_per_token"]
    ratio = pc.divide(inference, pc.if_else(pc.equal(per_token, 0.0), None, per_token))
    rounded = pc.round(ratio, round_mode="half_to_even")
    fits = pc.and_(pc.is_finite(rounded), pc.less(pc.abs(rounded), 2.0**63))  # as as_count
    output = pc.cast(pc.if_else(fits, rounded, None), pa.int64())
    seeds = pc.if_else(pc.is_valid(seed), seed, from_params["seed"])
    names = pa.array(list(endpoints))
    endpoint = pc.take(pa.array(list(endpoints.values())), pc.index_in(span, value_set=names))
    columns = {
        "ts": (pc.struct_field(head, "ts"), "string"),
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
        "seed": (seeds, "UInt64"),
    }
    frame = pd.DataFrame({c: arrow_to_pandas(v, t) for c, (v, t) in columns.items()})
    return frame, unreadable
