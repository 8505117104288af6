"""Model tasks: retrain the hotness forecaster, and predict the next window with the current one.

``prewarm.model.retrain(counts_path=None, name="hotness", data_dir=None, kind=None,
budget=None, engine=None)`` selects the hotness model on a counts table by backtest:
:class:`models.selection.SelectedForecaster` scores the baselines, blends, tiered rankings and
LightGBM's objectives on the latest windows at the plan's item budget (``budget``, default the
settings' ``budget.max_items``), and the winner is saved as a new version with its backtest table
in the metadata. The input is named, never guessed: ``engine`` reads that engine's observations
(``<data_dir>/observations/<engine>/counts.parquet``, written by the warm-up loop) and saves
under ``<data_dir>/models/<engine>/<name>``, where the loop's planner loads it; ``counts_path``
names any counts table (an ingest's ``counts.parquet`` or ``windows.parquet``), saved under
``<data_dir>/models/<name>``. Retraining on the same counts with the same code returns the
current version instead of adding one, so a redelivered message is harmless.
``prewarm.model.retrain_engines()`` (beat, every ``schedule.retrain_s``) retrains every
configured engine that has observations.

``prewarm.model.predict(counts_path=None, name="hotness", data_dir=None, kind=None, top=20,
engine=None)`` loads the current version, ranks every item for the window after the table's
last one, writes ``<data_dir>/predictions/<name>/<window start>.parquet`` and returns the top
items (the loop itself predicts inside its tick; this task is for a person asking).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import shared_task

from models.forecaster import SAVED_NAME
from models.persistence import load_model
from tasks.adapters.model_shelf import checked_out
from tasks.adapters.observations import Observations
from tasks.adapters.shared_store import shared_store
from tasks.base import PrewarmTask
from tasks.services.training import counts_frame, input_counts, train_and_save
from tasks.settings import current_settings


def _data_dir(data_dir: str | None) -> str:
    return data_dir or current_settings().data_dir


def _host_dir() -> Path:
    return current_settings().host_dir


@shared_task(name="prewarm.model.retrain", base=PrewarmTask)
def retrain(
    counts_path: str | None = None,
    name: str = SAVED_NAME,
    data_dir: str | None = None,
    kind: str | None = None,
    budget: int | None = None,
    engine: str | None = None,
) -> dict[str, Any]:
    """Select the hotness model on a counts table by backtest; save the winner as current."""
    base = _data_dir(data_dir)
    counts = input_counts(base, counts_path, engine)
    with checked_out(base, engine, _host_dir()) as root:
        return train_and_save(counts, root, name, kind, budget)


@shared_task(name="prewarm.model.retrain_engines", base=PrewarmTask, periodic=True)
def retrain_engines() -> dict[str, Any]:
    """Retrain the forecaster of every configured engine that has observations."""
    settings = current_settings()
    done: dict[str, Any] = {}
    for engine in settings.engines:
        observations = Observations(settings.data_dir, engine.name)
        if observations.version().windows >= settings.loop.min_windows_for_model:
            counts = input_counts(settings.data_dir, None, engine.name)
            with checked_out(settings.data_dir, engine.name, settings.host_dir) as root:
                done[engine.name] = train_and_save(counts, root)
    return {"engines": done}


@shared_task(name="prewarm.model.predict", base=PrewarmTask)
def predict(
    counts_path: str | None = None,
    name: str = SAVED_NAME,
    data_dir: str | None = None,
    kind: str | None = None,
    top: int = 20,
    engine: str | None = None,
) -> dict[str, Any]:
    """Rank every item for the next window with the current model; write and summarise it."""
    base = _data_dir(data_dir)
    counts = counts_frame(input_counts(base, counts_path, engine))
    with checked_out(base, engine, _host_dir()) as root:
        model = load_model(root, name)
    ranking = model.predict_next(counts, kind=kind)
    window = ranking["window_start"].iloc[0] if len(ranking) else None
    stamp = window.strftime("%Y%m%dT%H%M%SZ") if window is not None else "empty"
    store = shared_store(base)
    key = f"predictions/{name}/{stamp}.parquet"
    store.write_parquet(key, ranking)  # whole or absent: a reader never sees half of it
    out = store.path(key) if store.local else store.where(key)
    head = ranking.head(top)
    return {"window_start": window.isoformat() if window is not None else None,
            "items": len(ranking), "out": str(out),
            "top": [{"item_kind": str(k), "item_key": str(i), "predicted": float(p)}
                    for k, i, p in zip(head["item_kind"], head["item_key"], head["predicted"],
                                       strict=True)]}  # fmt: skip
