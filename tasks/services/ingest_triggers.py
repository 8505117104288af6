"""After an ingest: template hotness from the records, and cold-cache signals from the log.

``prewarm.events.after_ingest(ingest_dir)`` reads what ``prewarm ingest --out DIR`` wrote
(``records.parquet``, ``windows.parquet``, ``metrics.parquet``), stores request counts per
template for every configured repository, and turns the recent trigger events of the log
(hit-rate drops from the stats lines, request spikes, key drift) into warm-ups. Events older
than ``recent_s`` before the end of the log are history, reported but not acted on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.errors import BadInputError, TransientError
from pipeline.tables import read_parquet_file
from pipeline.triggers import TriggerEvent, log_signals
from tasks.adapters.cooldowns import cooldown_allows
from tasks.adapters.store import Store
from tasks.services.replica_watch import WarmNow
from tasks.services.repo_events import update_hotness
from tasks.settings import Settings

FLEET = "fleet"


def _frame(path: Path) -> pd.DataFrame:
    if not path.exists():
        raise BadInputError("missing (not an ingest output directory?)", where=str(path))
    return read_parquet_file(path, "an ingest table")


def _targets(settings: Settings, event: TriggerEvent) -> list[str]:
    # Counts-based events describe the whole fleet. A stats-line event names the log's
    # instance, ``<file>/<engine tag>``: a log file named after its engine (``<engine>.log``)
    # ties the event to that engine.
    names = [engine.name for engine in settings.engines]
    if event.engine == FLEET:
        return names
    first = event.engine.split("/")[0]
    aliases = {event.engine, first, Path(first).stem}
    return [name for name in names if name in aliases]


def act_on(
    settings: Settings, store: Store, events: list[TriggerEvent], warm: WarmNow
) -> list[dict[str, Any]]:
    """Warm now (``warm``: the "warm now" task) each engine an event names, past each
    (kind, engine) cooldown."""
    acted = []
    for event in events:
        for name in _targets(settings, event):
            local = TriggerEvent(event.kind, name, event.ts, event.detail)
            if cooldown_allows(store, local):
                acted.append({**local.to_dict(), **warm(name, event.kind)})
    return acted


def _hotness(settings: Settings, store: Store, records: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for repo in settings.template_repos:
        try:
            out[repo.name] = update_hotness(settings, store, repo.name, records)["matched"]
        except (TransientError, BadInputError) as exc:  # one bad repository must not stop the rest
            out[repo.name] = f"skipped: {exc}"
    return out


def process_ingest(
    settings: Settings,
    store: Store,
    ingest_dir: Path,
    recent_s: float | None = None,
    *,
    warm: WarmNow,
) -> dict[str, Any]:
    """Hotness per template, then the log's recent trigger events acted upon."""
    counts = _frame(ingest_dir / "windows.parquet")
    metrics = _frame(ingest_dir / "metrics.parquet")
    events = log_signals(metrics.to_dict("records"), counts, FLEET)
    recent_s = float(settings.schedule.window_s) if recent_s is None else recent_s
    end = max((e.ts for e in events), default=0.0)
    for frame, column in ((counts, "window_start"), (metrics, "ts")):
        if column in frame and len(frame):
            end = max(end, pd.Timestamp(frame[column].max()).timestamp())
    recent = [e for e in events if e.ts >= end - recent_s]
    return {
        "hotness": _hotness(settings, store, ingest_dir / "records.parquet"),
        "events": [e.to_dict() for e in events],
        "acted": act_on(settings, store, recent, warm),
    }
