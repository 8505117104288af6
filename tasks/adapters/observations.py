"""Observations: what the loop learned about one engine's traffic, shared by every process.

Per engine, under ``<data_dir>/observations/<engine>/`` (``data_dir`` is one volume shared by
every prewarm service):

* ``records.parquet`` — the most recent request records (``loop.keep_records``), the planner's
  candidates;
* ``counts.parquet`` — item × window counts (``item_kind``, ``item_key``, ``window_start``,
  ``requests``, ``prompt_tokens``, ``output_tokens``) of the last ``loop.keep_windows``
  windows, the forecaster's history; a window read over two ticks is summed, not doubled;
* ``manifest.json`` — the observations' version (one more per update), windows and rows.

Files are replaced atomically (temporary file, then rename), so a reader in another process
sees the old version or the new one, never half of one. One writer per engine at a time: the
loop holds the engine's lock in Redis while it updates them.

An update returns an :class:`ObservationsSnapshot`: the version it wrote and the frames it
wrote, so every later step of a tick (model, drift, plan, window close) works on the version
the tick observed, with each file read once per tick, never on whatever is newest by then.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd

from pipeline.errors import BadInputError
from pipeline.tables import read_parquet_file

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


def _write_parquet(frame: pd.DataFrame, path: Path) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    frame.to_parquet(temp, index=False)
    os.replace(temp, path)


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


def models_root(data_dir: Path, engine: str | None = None) -> Path:
    """Where forecasters are saved: per engine for the loop's (``<data_dir>/models/<engine>``),
    else shared (``<data_dir>/models``)."""
    return (
        Path(data_dir) / "models" / engine_folder(engine) if engine else Path(data_dir) / "models"
    )


class Observations:
    """One engine's observations in ``data_dir``."""

    def __init__(self, data_dir: Path, engine: str) -> None:
        self.engine = engine
        self.folder = Path(data_dir) / "observations" / engine_folder(engine)

    @property
    def records_path(self) -> Path:
        return self.folder / "records.parquet"

    @property
    def counts_path(self) -> Path:
        return self.folder / "counts.parquet"

    @property
    def manifest_path(self) -> Path:
        return self.folder / "manifest.json"

    def version(self) -> ObservationsVersion:
        """The current version (version 0: nothing observed yet)."""
        try:
            return ObservationsVersion(**json.loads(self.manifest_path.read_text()))
        except FileNotFoundError:
            return ObservationsVersion(self.engine)
        except (ValueError, TypeError) as exc:
            raise BadInputError(
                f"unreadable manifest ({exc})", where=str(self.manifest_path)
            ) from exc

    def records(self) -> pd.DataFrame | None:
        """The kept records, or None before the first."""
        return self._read(self.records_path)

    def counts(self) -> pd.DataFrame | None:
        """The kept item × window counts, or None before the first."""
        return self._read(self.counts_path)

    @staticmethod
    def _read(path: Path) -> pd.DataFrame | None:
        try:
            return read_parquet_file(path, "observations")
        except FileNotFoundError:
            return None

    def snapshot(self) -> ObservationsSnapshot:
        """The current version with its tables (each file read once)."""
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
        self.folder.mkdir(parents=True, exist_ok=True)
        kept = _kept_records(current.records, records, keep_records)
        merged = merge_counts(current.counts, counts)
        if merged is not None:
            merged = keep_last_windows(merged, keep_windows)
            _write_parquet(merged, self.counts_path)
        if kept is not None:
            _write_parquet(kept, self.records_path)
        windows = 0 if merged is None else int(merged["window_start"].nunique())
        last = None if merged is None else pd.Timestamp(merged["window_start"].max()).isoformat()
        version = ObservationsVersion(self.engine, current.version.version + 1, windows,
                                      0 if kept is None else len(kept), last)  # fmt: skip
        temp = self.manifest_path.with_name(f".manifest.{os.getpid()}.tmp")
        temp.write_text(json.dumps(version.to_dict()))
        os.replace(temp, self.manifest_path)
        return ObservationsSnapshot(version, kept, merged)


def _kept_records(
    old: pd.DataFrame | None, new: pd.DataFrame | None, keep: int
) -> pd.DataFrame | None:
    frames = [f for f in (old, new) if f is not None and len(f)]
    if not frames:
        return None
    both = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    return both.tail(keep).reset_index(drop=True)
