"""Parquet tables prewarm wrote (records, counts, observations), read back by their users."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from pipeline.errors import BadInputError


def read_parquet_file(path: Path, what: str) -> pd.DataFrame:
    """``path`` as a frame; a file that cannot be read (cut short, not Parquet, no permission)
    is bad input naming it and ``what`` it should hold. A missing file raises
    :class:`FileNotFoundError`, for the caller that takes it as "none yet"."""
    try:
        return pd.read_parquet(path)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        raise BadInputError(f"cannot read {what} ({exc})", where=str(path)) from exc
