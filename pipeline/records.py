"""The RequestRecord contract: one served request, whatever the source.

Records travel as pandas DataFrames with the canonical columns below. A source that does not
carry a field leaves it missing (``NA``); nothing is invented.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

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
    "params_hash": "string",
    "ttft_s": "Float64",
    "e2e_s": "Float64",
    "queue_s": "Float64",
    "status": "string",
}

RECORD_COLUMNS: tuple[str, ...] = tuple(RECORD_DTYPES)


def records_frame(rows: Iterable[Mapping[str, Any]] = ()) -> pd.DataFrame:
    """Build a records DataFrame with exactly the canonical columns and dtypes.

    Keys a row does not carry become missing; keys outside the contract are dropped.
    """
    frame = pd.DataFrame.from_records(list(rows), columns=list(RECORD_COLUMNS))
    return conform_records(frame)


def conform_records(frame: pd.DataFrame) -> pd.DataFrame:
    """Return ``frame`` with the canonical columns, in order, cast to the canonical dtypes."""
    out = frame.reindex(columns=list(RECORD_COLUMNS))
    for column, dtype in RECORD_DTYPES.items():
        if column == "ts":
            out[column] = pd.to_datetime(out[column], utc=True).astype(dtype)
        elif dtype != "object":
            out[column] = out[column].astype(dtype)
    return out
