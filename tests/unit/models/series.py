"""Synthetic counts tables in the counts shape of pipeline.windows, for model tests."""

from __future__ import annotations

import numpy as np
import pandas as pd

EPOCH = pd.Timestamp("2024-01-01T00:00:00Z")


def counts_from_matrix(
    requests: np.ndarray, window: pd.Timedelta, kind: str = "tenant", prompt_tokens: int = 100
) -> pd.DataFrame:
    """Long counts rows (requests > 0 only) from an (items, windows) array."""
    items, windows = np.nonzero(requests)
    return pd.DataFrame(
        {
            "item_kind": pd.Series([kind] * len(items), dtype="string"),
            "item_key": pd.Series([f"{kind}-{i}" for i in items], dtype="string"),
            "window_start": pd.Series(EPOCH + window * windows).astype("datetime64[us, UTC]"),
            "requests": requests[items, windows].astype("int64"),
            "prompt_tokens": (requests[items, windows] * prompt_tokens).astype("int64"),
            "output_tokens": (requests[items, windows] * 10).astype("int64"),
        }
    )


def daily_series(items: int = 16, days: int = 6, seed: int = 0) -> np.ndarray:
    """Poisson counts per 10-minute window with a daily cycle, items at different volumes."""
    rng = np.random.default_rng(seed)
    per_day = 144
    phase = 2 * np.pi * np.arange(days * per_day) / per_day
    level = rng.uniform(2, 40, size=(items, 1))
    shift = rng.uniform(0, 2 * np.pi, size=(items, 1))
    rate = level * (1 + 0.9 * np.sin(phase[None, :] + shift))
    return rng.poisson(rate).astype(float)
