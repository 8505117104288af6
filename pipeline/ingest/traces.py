"""Real request traces, and prewarm's own JSONL request format.

* **Mooncake** (``conversation_trace.jsonl``): one JSON object per line with ``timestamp``
  (milliseconds from the start of the trace), ``input_length``, ``output_length`` and
  ``hash_ids`` (prefix-block hashes of 512-token blocks). ``ts`` = ``epoch`` + timestamp;
  ``prefix_hashes`` = ``[str(h) for h in hash_ids]``, used as they are (not re-hashed).
  ``request_id`` = ``<file stem>:<line number>``.
* **Azure LLM inference traces** (``TIMESTAMP,ContextTokens,GeneratedTokens`` CSV): real
  UTC timestamps; no prompt, no prefix hashes. ``request_id`` = ``<file stem>:<line>``.
* **ServeGen** per-client series (``chunk-<n>-trace.csv``, no header: ``window_start_s,
  rate_req_per_s, iat_cv, iat_dist, param1, param2``): not requests but an aggregate. One
  client is one tenant: :func:`read_servegen` returns rows in the counts shape of
  :mod:`pipeline.windows` with ``item_kind="tenant"``, ``item_key="client-<n>"``,
  ``requests = round(rate * 600)`` per 10-minute window, ``window_start = epoch +
  window_start_s``, token sums 0 (the series carries none).
* **prewarm JSONL** (format name ``prewarm-jsonl``), for any other source: one JSON object per
  line whose keys are the canonical record columns of :mod:`pipeline.records`. ``ts`` is
  required: an ISO 8601 string (a zone-less one is taken as UTC) or a number of seconds since
  the Unix epoch. Optional: ``token_ids`` (a list of ints: prefix hashes are computed from
  them) and ``prefix_hashes`` (a list, used as given). When neither is given and ``prompt`` is
  present, prefix hashes are computed from the prompt text. Unknown keys are ignored. Example::

      {"ts": "2025-06-03T09:41:17Z", "request_id": "r1", "model": "llama-3-8b",
       "tenant": "acme", "prompt": "You are ...", "prompt_tokens": 812, "output_tokens": 64}

The traces carry relative times: ``TRACE_EPOCH`` (2024-01-01 00:00 UTC, a Monday, so a
ServeGen day starts at midnight) is the documented default epoch; every reader takes another.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.ingest.columnar import typed_values
from pipeline.ingest.lines import LineReader
from pipeline.ingest.reprs import INT64, UINT64
from pipeline.ingest.summary import Rejects
from pipeline.prefix_blocks import DEFAULT_BLOCK_SIZE, block_hashes, block_hashes_from_ids
from pipeline.records import RECORD_COLUMNS, RECORD_DTYPES, conform_records
from pipeline.windows import COUNT_DTYPES

TRACE_EPOCH = pd.Timestamp("2024-01-01T00:00:00Z")
SERVEGEN_WINDOW_S = 600
COUNT_COLUMNS = tuple(COUNT_DTYPES)
_SERVEGEN_NAME = re.compile(r"chunk-(\d+)-trace\.csv(?:\.(?:gz|bz2|xz|zst))?$")

Row = dict[str, Any]


def epoch_of(text: str | None) -> pd.Timestamp:
    """The start of a relative-time trace: ``text`` (ISO, UTC when zone-less) or the default."""
    epoch = pd.Timestamp(text) if text else TRACE_EPOCH
    return epoch.tz_localize("UTC") if epoch.tzinfo is None else epoch


def json_object(line: str) -> dict[str, Any] | None:
    """``line`` as a JSON object, or ``None`` (detection: never raises)."""
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _lines(path: Path, rejects: Rejects, reader: LineReader | None) -> Iterator[tuple[int, str]]:
    reader = reader or LineReader(path, rejects)
    for first, block in reader:
        for i, line in enumerate(block):
            if line.strip():
                yield first + i, line


def _rows(
    path: Path,
    rejects: Rejects,
    parse: Callable[[str, int], Row | None],
    reader: LineReader | None = None,
    dtypes: dict[str, str] = RECORD_DTYPES,
    detail: bool = False,
) -> list[Row]:
    """Rows of the lines of ``path`` (or of what ``reader`` reads of it: an incremental run's
    byte range, leaving a half-written last line for the next run). A row with a value its
    column (of ``dtypes``) cannot hold is a reject naming the column: the rows become columns
    all at once, where one such value would stop the whole file."""
    rows: list[Row] = []
    for line_no, line in _lines(path, rejects, reader):
        try:
            row = parse(line, line_no)
        except (ValueError, TypeError, KeyError, OverflowError) as exc:
            reason = f"{type(exc).__name__}: {exc}" if detail else type(exc).__name__
            rejects.add(f"bad row: {reason}", line_no, line)
            continue
        if row is None:
            continue
        fault = row_fault(row, dtypes)
        if fault is not None:
            rejects.add(f"bad row: {fault}", line_no, line)
            continue
        rows.append(row)
    return rows


#: the row reader for format modules: ``detail`` puts the error's text (the field it names) in
#: each reject's reason
rows_of = _rows


#: the integers a column of each integer dtype holds
_INTEGER_RANGES = {"Int64": INT64, "int64": INT64, "UInt64": UINT64}


def row_fault(row: Row, dtypes: dict[str, str]) -> str | None:
    """What keeps ``row`` out of the columns of ``dtypes`` ("<column> out of range", "<column>
    not Int64", ...), or None. Times must be within pandas' nanosecond range (1677-2262):
    parts hold them as nanoseconds."""
    for column, value in row.items():
        dtype = dtypes.get(column)
        if value is None or dtype is None or dtype in ("string", "object"):
            continue  # (a string column takes any value's text)
        if dtype.startswith("datetime64"):
            if not _in_time_range(value):
                return f"{column} out of range"
        elif not _holds(dtype, value):
            return f"{column} not {dtype}"
    return None


#: the first and last times a part holds (nanoseconds since 1970 in 64 bits)
_FIRST_NS, _LAST_NS = pd.Timestamp.min.tz_localize("UTC"), pd.Timestamp.max.tz_localize("UTC")


def _in_time_range(value: Any) -> bool:
    if isinstance(value, pd.Timestamp) and value.tzinfo is not None:  # (the readers' times)
        return bool(_FIRST_NS <= value <= _LAST_NS)
    try:
        pd.Timestamp(value).as_unit("ns")
    except (ValueError, TypeError, OverflowError):  # OutOfBoundsDatetime is a ValueError
        return False
    return True


def _holds(dtype: str, value: Any) -> bool:
    """Whether a column of ``dtype`` (an integer, float or boolean dtype) takes ``value`` as
    :func:`~pipeline.ingest.parse.heads_frame` converts it: integers by range, floats by
    type; any other value is converted alone by that conversion (:func:`typed_values`)."""
    bounds = _INTEGER_RANGES.get(dtype)
    if type(value) is int and bounds is not None:
        return value in bounds
    if type(value) is float and dtype in ("Float64", "float64"):
        return True
    if type(value) is float and dtype in ("Int64", "int64") and bounds is not None:
        if value != value:  # NaN: missing, where a value may be
            return dtype == "Int64"
        return value.is_integer() and int(value) in bounds  # (a float: ranges test ints)
    try:
        typed_values([value], dtype)
    except Exception:  # pandas raises several unrelated types (IndexError for a list ...)
        return False
    return True


def _trace_frame(rows: list[Row]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(RECORD_COLUMNS))
    frame["source"] = "trace"
    return conform_records(frame)


def _count(value: Any) -> int:
    """A non-negative integer count; bools and negatives are errors, not counts."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"not a count: {value!r}")
    if value != int(value):
        raise ValueError(f"not a whole count: {value!r}")
    return int(value)


# --- Mooncake -------------------------------------------------------------------------------


def mooncake_rows(
    path: Path,
    rejects: Rejects,
    epoch: pd.Timestamp = TRACE_EPOCH,
    reader: LineReader | None = None,
) -> list[Row]:
    """Record rows of a Mooncake JSONL trace; bad lines are counted in ``rejects``."""
    stem = path.name.split(".")[0]

    def parse(line: str, line_no: int) -> Row:
        obj = json.loads(line)
        hashes = obj["hash_ids"]
        if not isinstance(hashes, list):
            raise TypeError("hash_ids is not a list")
        return {
            "ts": epoch + pd.Timedelta(milliseconds=_count(obj["timestamp"])),
            "request_id": f"{stem}:{line_no}",
            "prompt_tokens": _count(obj["input_length"]),
            "output_tokens": _count(obj["output_length"]),
            "prefix_hashes": [str(h) for h in hashes],
        }

    return _rows(path, rejects, parse, reader)


def read_mooncake(path: str | Path, epoch: pd.Timestamp = TRACE_EPOCH) -> pd.DataFrame:
    """Records of a Mooncake trace (``ts`` = ``epoch`` + ``timestamp`` ms; hashes as given)."""
    return _trace_frame(mooncake_rows(Path(path), Rejects(str(path)), epoch))


# --- Azure ----------------------------------------------------------------------------------


def azure_rows(path: Path, rejects: Rejects, reader: LineReader | None = None) -> list[Row]:
    """Record rows of an Azure LLM inference trace CSV (header line skipped)."""
    stem = path.name.split(".")[0]

    def parse(line: str, line_no: int) -> Row | None:
        fields = line.rstrip("\r").split(",")
        if fields[0] == "TIMESTAMP":
            return None
        if len(fields) != 3:
            raise ValueError(f"{len(fields)} fields, expected 3")
        return {
            "ts": _azure_ts(fields[0]),
            "request_id": f"{stem}:{line_no}",
            "prompt_tokens": _count(int(fields[1])),
            "output_tokens": _count(int(fields[2])),
        }

    return _rows(path, rejects, parse, reader)


def _azure_ts(text: str) -> pd.Timestamp:
    # Azure writes 7 fractional digits (.NET ticks); pandas parses to ns, we keep us.
    ts = pd.Timestamp(text)
    if pd.isna(ts):
        raise ValueError(f"bad timestamp {text!r}")
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def read_azure(path: str | Path) -> pd.DataFrame:
    """Records of an Azure LLM inference trace (code or conversation)."""
    return _trace_frame(azure_rows(Path(path), Rejects(str(path))))


# --- ServeGen -------------------------------------------------------------------------------


def servegen_client(path: Path) -> str | None:
    """``client-<n>`` from a ``chunk-<n>-trace.csv`` name, compressed or not (the file name
    is the only id); None where the name names no client."""
    match = _SERVEGEN_NAME.search(path.name)
    return None if match is None else f"client-{match.group(1)}"


def servegen_rows(
    path: Path,
    rejects: Rejects,
    epoch: pd.Timestamp = TRACE_EPOCH,
    reader: LineReader | None = None,
) -> list[Row]:
    """Counts rows (tenant × window) of one ServeGen client file; idle windows dropped. In a
    file whose name names no client (read as ServeGen by ``--format``), every row is a reject
    saying so."""
    client = servegen_client(path)
    if client is None:
        for line_no, line in _lines(path, rejects, reader):
            rejects.add("ServeGen row of a file not named chunk-<n>-trace.csv", line_no, line)
        return []

    def parse(line: str, line_no: int) -> Row | None:
        fields = line.rstrip("\r").split(",")
        if len(fields) != 6:
            raise ValueError(f"{len(fields)} fields, expected 6")
        start_s, rate = float(fields[0]), float(fields[1])
        if rate < 0 or start_s < 0 or rate != rate:
            raise ValueError(f"negative or NaN rate/start: {fields[:2]}")
        requests = round(rate * SERVEGEN_WINDOW_S)
        if requests == 0:
            return None
        start = epoch + pd.Timedelta(seconds=start_s)
        return {"item_kind": "tenant", "item_key": client, "window_start": start,
                "requests": requests, "prompt_tokens": 0, "output_tokens": 0}  # fmt: skip

    return _rows(path, rejects, parse, reader, COUNT_DTYPES)


def counts_frame(rows: list[Row]) -> pd.DataFrame:
    """A counts-shape DataFrame (see :mod:`pipeline.windows`) from row dicts."""
    frame = pd.DataFrame(rows, columns=list(COUNT_COLUMNS))
    return frame.astype(COUNT_DTYPES)


def read_servegen(path_or_dir: str | Path, epoch: pd.Timestamp = TRACE_EPOCH) -> pd.DataFrame:
    """Tenant × 10-minute-window request counts of one ServeGen file or a folder of them."""
    root = Path(path_or_dir)
    files = sorted(root.rglob("chunk-*-trace.csv")) if root.is_dir() else [root]
    rows: list[Row] = []
    for path in files:
        rows.extend(servegen_rows(path, Rejects(str(path)), epoch))
    frame = counts_frame(rows)
    return frame.sort_values(["item_key", "window_start"], ignore_index=True)


# --- prewarm JSONL --------------------------------------------------------------------------


def jsonl_rows(
    path: Path,
    rejects: Rejects,
    block_size: int = DEFAULT_BLOCK_SIZE,
    reader: LineReader | None = None,
) -> list[Row]:
    """Record rows of prewarm's own JSONL request format (see the module docstring)."""

    def parse(line: str, line_no: int) -> Row:
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise TypeError("a line must be a JSON object")
        row = {key: obj[key] for key in RECORD_COLUMNS if key in obj}
        row["ts"] = _jsonl_ts(obj["ts"])
        row["prefix_hashes"] = _jsonl_hashes(obj, block_size)
        row.setdefault("source", "gateway")
        return row

    return _rows(path, rejects, parse, reader)


def _jsonl_ts(value: Any) -> pd.Timestamp:
    if isinstance(value, bool):
        raise TypeError("ts is a bool")
    if isinstance(value, int | float):
        return pd.Timestamp(value, unit="s", tz="UTC")
    ts = pd.Timestamp(str(value))
    if pd.isna(ts):
        raise ValueError(f"bad ts {value!r}")
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def _jsonl_hashes(obj: dict[str, Any], block_size: int) -> list[str] | None:
    if isinstance(obj.get("prefix_hashes"), list):
        return [str(h) for h in obj["prefix_hashes"]]
    ids = obj.get("token_ids")
    if isinstance(ids, list):
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise TypeError("token_ids must be integers")
        return block_hashes_from_ids(ids, block_size)
    if isinstance(obj.get("prompt"), str):
        return block_hashes(obj["prompt"], block_size)
    return None


def read_jsonl(path: str | Path, block_size: int = DEFAULT_BLOCK_SIZE) -> pd.DataFrame:
    """Records of a prewarm JSONL request file."""
    rows = jsonl_rows(Path(path), Rejects(str(path)), block_size)
    frame = pd.DataFrame(rows, columns=list(RECORD_COLUMNS))
    return conform_records(frame)
