"""An engine's topic mixes per window, beside its observations
(``<data_dir>/observations/<engine>/topics.parquet``: ``window_start`` in Unix seconds,
``topic``, ``prompts``), shared by every process as the observations are.

The object is replaced whole (:mod:`tasks.adapters.shared_store`); a window read over two
ticks is summed; only the last
``keep_windows`` windows are kept. The mixes are labelled by one fitted topic model: when the
model is fitted again (after a drift) the history is cleared with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from pipeline.topic_drift import TopicMix
from tasks.adapters.observations import engine_folder
from tasks.adapters.shared_store import shared_store

COLUMNS = ["window_start", "topic", "prompts"]
DTYPES = {"window_start": "float64", "topic": "string", "prompts": "float64"}


class TopicHistory:
    """One engine's topic mixes in ``data_dir``."""

    def __init__(self, data_dir: str | Path, engine: str) -> None:
        self.store = shared_store(data_dir)
        self.key = f"observations/{engine_folder(engine)}/topics.parquet"

    @property
    def path(self) -> Path:
        """The file's path (a folder store)."""
        return Path(self.store.path(self.key))

    def frame(self) -> pd.DataFrame:
        """Every kept row (empty when there is none)."""
        frame = self.store.read_parquet(self.key, "topic mixes")
        if frame is None:
            return pd.DataFrame({c: pd.Series(dtype=t) for c, t in DTYPES.items()})
        return frame

    def mixes(self) -> list[TopicMix]:
        """Each kept window's mix, oldest first."""
        frame = self.frame()
        return [
            (float(start), dict(zip(rows["topic"].astype(str), rows["prompts"], strict=True)))
            for start, rows in frame.groupby("window_start", sort=True)
        ]

    def append(self, mixes: Mapping[float, Mapping[str, float]], keep_windows: int) -> None:
        """Add windows' mixes (summed with what a window already holds), keep the newest."""
        rows = [{"window_start": float(w), "topic": t, "prompts": float(n)}
                for w, mix in mixes.items() for t, n in mix.items()]  # fmt: skip
        if not rows:
            return
        both = pd.concat([self.frame(), pd.DataFrame(rows, columns=COLUMNS)], ignore_index=True)
        both["topic"] = both["topic"].astype("string")
        summed = both.groupby(["window_start", "topic"], sort=True)["prompts"].sum().reset_index()
        starts = summed["window_start"].drop_duplicates().sort_values()
        kept = summed[summed["window_start"] >= starts.iloc[-min(keep_windows, len(starts))]]
        self.store.write_parquet(self.key, kept)

    def clear(self) -> None:
        """Forget every mix (the topics they were counted in are gone)."""
        self.store.delete(self.key)
