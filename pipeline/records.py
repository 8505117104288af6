"""The RequestRecord contract: one served request, whatever the source.

Records travel as pandas DataFrames with the canonical columns below. A source that does not
carry a field leaves it missing (``NA``); nothing is invented.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
import pyarrow as pa

SOURCES = ("vllm", "tgi", "trace", "gateway")

#: canonical column -> pandas dtype
RECORD_DTYPES: dict[str, str] = {
    "ts": "datetime64[us, UTC]",
    "source": "string",
    "request_id": "string",
    "model": "string",
    "adapter": "string",
    "tenant": "string",
    "endpoint": "string",
    "prompt": "string",
    "prompt_truncated": "boolean",
    "prompt_tokens": "Int64",
    "output_tokens": "Int64",
    "prefix_hashes": "object",  # list[str] chain of block hashes, or NA
    "temperature": "Float64",
    "top_p": "Float64",
    "top_k": "Int64",
    "max_tokens": "Int64",
    "seed": "UInt64",  # TGI draws u64 seeds; vLLM's are >= 0 in practice (negative: missing)
    "seed_used": "UInt64",  # the seed the server drew where the client sent none (TGI prints it)
    "params_hash": "string",
    "ttft_s": "Float64",
    "e2e_s": "Float64",
    "queue_s": "Float64",
    "status": "string",
    # a gateway's records (LiteLLM's request log): the request as the client sent it (JSON in
    # the client's field order, less metadata), whether its cache answered, who served it
    "request_body": "string",
    "cache_hit": "boolean",
    "deployment": "string",
}

RECORD_COLUMNS: tuple[str, ...] = tuple(RECORD_DTYPES)

#: ``prefix_hashes`` as ingest carries it between its steps: Arrow lists of strings in the
#: column (no Python list per row, ~20 Python strings each); records handed out hold lists
HASHES_TYPE = pa.list_(pa.string())


def records_frame(rows: Iterable[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """Build a records DataFrame with exactly the canonical columns and dtypes.

    Keys a row does not carry become missing; keys outside the contract are dropped.
    """
    frame = pd.DataFrame.from_records(list(rows), columns=list(RECORD_COLUMNS))
    return conform_records(frame)


def conform_records(frame: pd.DataFrame) -> pd.DataFrame:
    """Return ``frame`` with the canonical columns, in order, cast to the canonical dtypes."""
    out = frame.reindex(columns=list(RECORD_COLUMNS))
    for column, dtype in _PANDAS_DTYPES.items():
        if out[column].dtype == dtype:  # already canonical (ingest's columns): no copy
            continue
        if column == "ts":
            out[column] = pd.to_datetime(out[column], utc=True).astype(dtype)
        elif dtype != "object":
            out[column] = out[column].astype(dtype)
    return out


#: the canonical dtypes as dtype objects: ``StringDtype("python") == "string"`` holds, but a
#: column of it is still cast to the canonical (Arrow-held) strings
_PANDAS_DTYPES = {c: pd.api.types.pandas_dtype(t) for c, t in RECORD_DTYPES.items()}


def arrow_hashes(column: pd.Series) -> pa.Array | None:
    """A ``prefix_hashes`` column held as Arrow lists, as one array; ``None`` when it holds
    Python lists."""
    if not isinstance(column.dtype, pd.ArrowDtype):
        return None
    values = pa.array(column)  # an ArrowExtensionArray hands out its chunks
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def hashes_column(values: pa.Array, index: pd.Index) -> pd.Series:
    """Arrow lists of block hashes as a ``prefix_hashes`` column (no copy)."""
    return pd.Series(pd.arrays.ArrowExtensionArray(values), index=index, name="prefix_hashes")


def listed_hashes(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with ``prefix_hashes`` as Python lists (``None`` where missing), the record
    contract's form, whichever form it had."""
    hashes = arrow_hashes(frame["prefix_hashes"])
    if hashes is not None:
        frame["prefix_hashes"] = pd.Series(hashes.to_pylist(), index=frame.index, dtype=object)
    return frame
