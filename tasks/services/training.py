"""Training the hotness forecaster: select it on a counts table by backtest, save the winner
(:class:`models.selection.SelectedForecaster`); the same counts with the same code reuse the
current version, so a redelivered message is harmless."""

from __future__ import annotations

import hashlib
import io
import time
from pathlib import Path
from typing import Any

import pandas as pd

from models.forecaster import SAVED_NAME
from models.persistence import code_version, read_saved, save_model
from models.selection import SELECTION_KEY, SelectedForecaster, selection_metadata
from pipeline.errors import BadInputError
from pipeline.evaluation import CountMatrix, latest_windows_that_fit
from tasks.adapters.observations import Observations
from tasks.adapters.shared_store import shared_store
from tasks.settings import current_settings


def input_counts(data_dir: str | Path, counts_path: str | None, engine: str | None) -> bytes:
    """The counts table a model task reads (Parquet bytes): the one named (a path or a URL), or
    the engine's observations in the shared store."""
    if counts_path:
        folder, _, name = counts_path.rstrip("/").rpartition("/")
        data = shared_store(folder or ".").read_bytes(name)
        where = counts_path
    else:
        if not engine:
            raise BadInputError("name the input: counts_path or engine", where="prewarm.model")
        observations = Observations(data_dir, engine)
        data = observations.store.read_bytes(observations.counts_key)
        where = observations.store.where(observations.counts_key)
    if data is None:
        raise BadInputError("no counts there (no observations yet?)", where=where)
    return data


def counts_frame(data: bytes) -> pd.DataFrame:
    """The Parquet bytes of a counts table as a frame."""
    try:
        return pd.read_parquet(io.BytesIO(data))
    except (OSError, ValueError) as exc:
        raise BadInputError(f"cannot read counts ({exc})", where="counts") from exc


def _digest(data: bytes) -> str:
    return f"{hashlib.sha256(data).hexdigest()}/{code_version()}"


def _same_training(root: Path, name: str, source: str, kind: str | None) -> dict[str, Any] | None:
    try:
        saved = read_saved(root, name)
    except BadInputError:
        return None
    extra = saved.metadata.get("extra", {})
    if extra.get("source") == source and extra.get("kind") == kind:
        return {"version": saved.path.name, "path": str(saved.path), "reused": True}
    return None


def train_and_save(
    data: bytes,
    root: Path,
    name: str = SAVED_NAME,
    kind: str | None = None,
    budget: int | None = None,
) -> dict[str, Any]:
    """Select the forecaster on the counts table ``data`` (Parquet bytes) by backtest; save the
    winner under ``root``."""
    source = _digest(data)
    reused = _same_training(root, name, source, kind)
    if reused is not None:
        return reused
    return train_on_counts(counts_frame(data), source, root, name, kind, budget)


def train_on_counts(
    counts: pd.DataFrame,
    source: str,
    root: Path,
    name: str = SAVED_NAME,
    kind: str | None = None,
    budget: int | None = None,
) -> dict[str, Any]:
    """Select the forecaster on ``counts`` (named ``source`` in the saved metadata) by
    backtest; save the winner under ``root``."""
    reused = _same_training(root, name, source, kind)
    if reused is not None:
        return reused
    started = time.monotonic()
    settings = current_settings()
    items = budget or settings.budget.max_items
    tokens = settings.budget.max_tokens
    selected = SelectedForecaster(budgets=(items,), metric=settings.loop.selection_metric,
                                  budget_tokens=(tokens,) if tokens else ())  # fmt: skip
    fitting, left_out = latest_windows_that_fit(counts, kind)
    selected.fit(CountMatrix.from_counts(fitting, kind=kind))
    note = selected.note_ + _history_note(left_out)
    selection = selection_metadata(selected)
    selection[SELECTION_KEY].update(note=note, windows_left_out=left_out)
    extra = {"source": source, "kind": kind, **selection}
    folder = save_model(selected.winner_, root, name, extra=extra)
    return {"version": folder.name, "path": str(folder), "reused": False,
            "winner": selected.winner_name_, "note": note,
            "trained_until": selected.trained_until_.isoformat(),
            "seconds": round(time.monotonic() - started, 3)}  # fmt: skip


def _history_note(left_out: int) -> str:
    if not left_out:
        return ""
    return (f"; the latest windows only: {left_out} older window(s) left out, the whole "
            f"history's items x windows being more than one matrix holds")  # fmt: skip
