"""Observations: what the loop learned about one engine's traffic, shared by every process.

Per engine, under ``<data_dir>/observations/<engine>/`` in the shared store
(:mod:`tasks.adapters.shared_store`: a folder, or a bucket every host reaches):

* ``records.parquet`` — the most recent request records (``loop.keep_records``), the planner's
  candidates;
* ``counts.parquet`` — item × window counts (``item_kind``, ``item_key``, ``window_start``,
  ``requests``, ``prompt_tokens``, ``output_tokens``) of the last ``loop.keep_windows``
  windows, the forecaster's history; a window read over two ticks is summed, not doubled;
* ``manifest.json`` — the observations' version (one more per update), windows and rows.

Objects are replaced whole (a folder's by rename, a bucket's by one PUT), so a reader on
another host sees the old version or the new one, never half of one; the manifest is written
last, so a version names tables that are all there. One writer per engine at a time: the
loop holds the engine's lock in Redis while it updates them.

An update returns an :class:`ObservationsSnapshot`: the version it wrote and the frames it
wrote, so every later step of a tick (model, drift, plan, window close) works on the version
the tick observed, with each file read once per tick, never on whatever is newest by then.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd

from pipeline.errors import BadInputError
from tasks.adapters.shared_store import SharedStore, shared_store

COUNT_KEYS = ["item_kind", "item_key", "window_start"]


@dataclass(frozen=True)
class ObservationsVersion:
    """Which observations a tick (or a plan, or a model) was built from."""

    engine: str
    version: int = 0
    windows: int = 0
    records: int = 0
    last_window: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ObservationsSnapshot:
    """One version of an engine's observations with its tables, as one tick observed them.

    Immutable by contract: steps read ``records`` and ``counts``, none changes them.
    """

    version: ObservationsVersion
    records: pd.DataFrame | None = None
    counts: pd.DataFrame | None = None

    @property
    def windows(self) -> int:
        return self.version.windows


def merge_counts(old: pd.DataFrame | None, new: pd.DataFrame | None) -> pd.DataFrame | None:
    """Counts of both frames, summed per item and window (a window split over reads)."""
    frames = [f for f in (old, new) if f is not None and len(f)]
    if not frames:
        return None
    both = pd.concat(frames, ignore_index=True)
    numeric = [
        c for c in both.columns if c not in COUNT_KEYS and pd.api.types.is_numeric_dtype(both[c])
    ]
    summed = both.groupby(COUNT_KEYS, observed=True, sort=True)[numeric].sum().reset_index()
    return summed


def keep_last_windows(counts: pd.DataFrame, windows: int) -> pd.DataFrame:
    """The rows of the last ``windows`` distinct windows."""
    starts = counts["window_start"].drop_duplicates().sort_values()
    cutoff = starts.iloc[-windows] if len(starts) > windows else starts.iloc[0]
    return counts[counts["window_start"] >= cutoff].reset_index(drop=True)


def engine_folder(engine: str) -> str:
    """An engine's name as one path part (``/``, ``..`` and the like escaped)."""
    return (
        quote(engine, safe="")
        if engine not in (".", "..")
        else quote(engine, safe="").replace(".", "%2E")
    )


def models_key(engine: str | None = None) -> str:
    """Where forecasters are saved in the shared store: per engine for the loop's
    (``models/<engine>``), else shared (``models``)."""
    return f"models/{engine_folder(engine)}" if engine else "models"


def models_root(data_dir: str | Path, engine: str | None = None) -> Path:
    """The folder of :func:`models_key` when ``data_dir`` is a folder (the model tasks' and
    commands' own files); a bucket's models are checked out by :mod:`tasks.adapters.model_shelf`."""
    return Path(str(data_dir)) / models_key(engine)


class Observations:
    """One engine's observations in the shared store at ``data_dir``."""

    def __init__(self, data_dir: str | Path | SharedStore, engine: str) -> None:
        self.engine = engine
        self.store = shared_store(data_dir)
        self.prefix = f"observations/{engine_folder(engine)}"

    @property
    def folder(self) -> Path:
        """The observations' folder (a folder store; a bucket's is its key)."""
        return Path(self.store.path(self.prefix))

    @property
    def records_key(self) -> str:
        return f"{self.prefix}/records.parquet"

    @property
    def counts_key(self) -> str:
        return f"{self.prefix}/counts.parquet"

    @property
    def manifest_key(self) -> str:
        return f"{self.prefix}/manifest.json"

    @property
    def records_path(self) -> Path:
        return self.folder / "records.parquet"

    @property
    def counts_path(self) -> Path:
        return self.folder / "counts.parquet"

    def version(self) -> ObservationsVersion:
        """The current version (version 0: nothing observed yet)."""
        raw = self.store.read_json(self.manifest_key)
        if raw is None:
            return ObservationsVersion(self.engine)
        try:
            return ObservationsVersion(**raw)
        except TypeError as exc:
            raise BadInputError(
                f"unreadable manifest ({exc})", where=self.store.where(self.manifest_key)
            ) from exc

    def records(self) -> pd.DataFrame | None:
        """The kept records, or None before the first."""
        return self.store.read_parquet(self.records_key, "observations")

    def counts(self) -> pd.DataFrame | None:
        """The kept item × window counts, or None before the first."""
        return self.store.read_parquet(self.counts_key, "observations")

    def snapshot(self) -> ObservationsSnapshot:
        """The current version with its tables (each object read once)."""
        return ObservationsSnapshot(self.version(), self.records(), self.counts())

    def append(
        self,
        records: pd.DataFrame | None,
        counts: pd.DataFrame | None,
        keep_records: int,
        keep_windows: int,
    ) -> ObservationsSnapshot:
        """Add newly read records and counts, keep the most recent, write a new version; the
        snapshot of what was written (unchanged observations: the current one)."""
        current = self.snapshot()
        if (records is None or records.empty) and (counts is None or counts.empty):
            return current
        kept = _kept_records(current.records, records, keep_records)
        merged = merge_counts(current.counts, counts)
        if merged is not None:
            merged = keep_last_windows(merged, keep_windows)
            self.store.write_parquet(self.counts_key, merged)
        if kept is not None:
            self.store.write_parquet(self.records_key, kept)
        windows = 0 if merged is None else int(merged["window_start"].nunique())
        last = None if merged is None else pd.Timestamp(merged["window_start"].max()).isoformat()
        version = ObservationsVersion(self.engine, current.version.version + 1, windows,
                                      0 if kept is None else len(kept), last)  # fmt: skip
        self.store.write_json(self.manifest_key, version.to_dict())
        return ObservationsSnapshot(version, kept, merged)


def _kept_records(
    old: pd.DataFrame | None, new: pd.DataFrame | None, keep: int
) -> pd.DataFrame | None:
    frames = [f for f in (old, new) if f is not None and len(f)]
    if not frames:
        return None
    both = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    return both.tail(keep).reset_index(drop=True)
