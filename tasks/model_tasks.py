"""Model tasks: retrain the hotness forecaster, and predict the next window with the current one.

``prewarm.model.retrain(counts_path=None, name="hotness", data_dir=None, kind=None,
budget=None)`` selects the hotness model on a counts table (the ``counts.parquet`` an ingest
writes, by default the newest one under ``<data_dir>/ingest``; a ``windows.parquet`` works too):
:class:`models.selection.SelectedForecaster` backtests the baselines, blends and LightGBM's
objectives on the latest windows at the plan's item budget (``budget``, default the settings'
``budget.max_items``), and the winner is saved as a new version under
``<data_dir>/models/<name>`` with its backtest table in the metadata. Retraining on the same
counts file with the same code returns the current version instead of adding one, so a
redelivered message is harmless.

``prewarm.model.predict(counts_path=None, name="hotness", data_dir=None, kind=None, top=20)``
loads the current version, ranks every item for the window after the table's last one, writes
``<data_dir>/predictions/<name>/<window start>.parquet`` and returns the top items.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import pandas as pd
from celery import shared_task

from models.forecaster import SAVED_NAME
from models.persistence import code_version, load_model, read_saved, save_model
from models.selection import SelectedForecaster, selection_metadata
from pipeline.errors import BadInputError
from pipeline.evaluation import CountMatrix
from tasks.settings import current_settings


def _data_dir(data_dir: str | None) -> Path:
    return Path(data_dir) if data_dir else current_settings().data_dir


def newest_counts(data_dir: Path) -> Path:
    """The newest ``counts.parquet`` (else ``windows.parquet``) of an ingest under ``data_dir``."""
    for name in ("counts.parquet", "windows.parquet"):
        found = sorted((data_dir / "ingest").rglob(name), key=lambda p: p.stat().st_mtime)
        if found:
            return found[-1]
    raise BadInputError("no counts.parquet yet (ingest something first)", where=str(data_dir))


def _counts(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as exc:
        raise BadInputError(f"cannot read counts ({exc})", where=str(path)) from exc


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return f"{digest.hexdigest()}/{code_version()}"


def _same_training(root: Path, name: str, source: str, kind: str | None) -> dict[str, Any] | None:
    try:
        saved = read_saved(root, name)
    except BadInputError:
        return None
    extra = saved.metadata.get("extra", {})
    if extra.get("source") == source and extra.get("kind") == kind:
        return {"version": saved.path.name, "path": str(saved.path), "reused": True}
    return None


@shared_task(name="prewarm.model.retrain", acks_late=True)
def retrain(
    counts_path: str | None = None,
    name: str = SAVED_NAME,
    data_dir: str | None = None,
    kind: str | None = None,
    budget: int | None = None,
) -> dict[str, Any]:
    """Select the hotness model on a counts table by backtest; save the winner as current."""
    base = _data_dir(data_dir)
    path = Path(counts_path) if counts_path else newest_counts(base)
    root, source = base / "models", _digest(path)
    reused = _same_training(root, name, source, kind)
    if reused is not None:
        return reused
    started = time.monotonic()
    items = budget or current_settings().budget.max_items
    selected = SelectedForecaster(budgets=(items,))
    selected.fit(CountMatrix.from_counts(_counts(path), kind=kind))
    extra = {"source": source, "kind": kind, **selection_metadata(selected)}
    folder = save_model(selected.winner_, root, name, extra=extra)
    return {"version": folder.name, "path": str(folder), "reused": False,
            "winner": selected.winner_name_, "note": selected.note_,
            "trained_until": selected.trained_until_.isoformat(),
            "seconds": round(time.monotonic() - started, 3)}  # fmt: skip


@shared_task(name="prewarm.model.predict", acks_late=True)
def predict(
    counts_path: str | None = None,
    name: str = SAVED_NAME,
    data_dir: str | None = None,
    kind: str | None = None,
    top: int = 20,
) -> dict[str, Any]:
    """Rank every item for the next window with the current model; write and summarise it."""
    base = _data_dir(data_dir)
    path = Path(counts_path) if counts_path else newest_counts(base)
    model = load_model(base / "models", name)
    ranking = model.predict_next(_counts(path), kind=kind)
    window = ranking["window_start"].iloc[0] if len(ranking) else None
    stamp = window.strftime("%Y%m%dT%H%M%SZ") if window is not None else "empty"
    out = base / "predictions" / name / f"{stamp}.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.with_suffix(".tmp")
    ranking.to_parquet(temp, index=False)
    temp.replace(out)  # atomic: a reader never sees half a file
    head = ranking.head(top)
    return {"window_start": window.isoformat() if window is not None else None,
            "items": len(ranking), "out": str(out),
            "top": [{"item_kind": str(k), "item_key": str(i), "predicted": float(p)}
                    for k, i, p in zip(head["item_kind"], head["item_key"], head["predicted"],
                                       strict=True)]}  # fmt: skip
