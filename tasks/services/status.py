"""What the loop is doing, per engine, for ``prewarm status``, the api and health checks.

Read only: the store Redis (source statuses, last tick, last plan per reason and its live
progress, next tick, periodic task health) and the models folder. Nothing here starts work.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pipeline.errors import BadInputError
from tasks.adapters import redis_keys, replica_holdings
from tasks.adapters.connections import redacted
from tasks.adapters.observations import Observations, models_root
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.sources import SourceStates, source_id
from tasks.adapters.store import Store
from tasks.adapters.task_health import failing_tasks
from tasks.services.fleets import fleet_settings, fleet_status
from tasks.settings import EngineSettings, Settings


def _json(raw: bytes | str | None) -> dict[str, Any] | None:
    return json.loads(raw) if raw else None


def model_version(settings: Settings, engine: str) -> str | None:
    """The saved forecaster the engine's plans use — its version and the backtest winner — or
    None (fitted or frequency)."""
    from models.forecaster import SAVED_NAME
    from models.selection import saved_selection

    root = models_root(settings.data_dir, engine)
    if not (root / SAVED_NAME).exists():
        return None
    saved = saved_selection(root, SAVED_NAME)
    return None if saved is None else f"{saved['version']} (winner {saved['winner']})"


def plan_progress(store: Store, outcome: dict[str, Any] | None) -> dict[str, Any] | None:
    """An outcome with its plan's live results: warmed (items tried), verified, failed."""
    if outcome is None or not outcome.get("plan_id"):
        return outcome
    try:
        report = PlanStore(store).report(outcome["plan_id"])
    except BadInputError:  # deleted with old plans, or expired
        return {**outcome, "progress": "plan no longer stored"}
    return {**outcome, "warmed": report["items_ok"] + report["items_failed"],
            "verified": report["items_ok"], "failed": report["items_failed"],
            "batches": report["batches"], "committed": report["committed"],
            "rolled_back": report["rolled_back"], "done": report["done"],
            "resumed": report.get("resumed", 0),
            "holdings": report.get("holdings"),
            "warm_seconds": report.get("seconds")}  # fmt: skip


def sources_status(settings: Settings, store: Store, engine: str) -> list[dict[str, Any]]:
    """Each configured source of ``engine`` and how far it was read (never read: no status)."""
    seen = SourceStates(store).statuses(engine)
    out = []
    for source in settings.sources_of(engine):
        status = seen.get(source_id(source)) or {"error": None, "read": "not read yet"}
        out.append({"kind": source.kind, "path": source.path, **status})
    return out


def engine_status(
    settings: Settings, store: Store, engine: EngineSettings, now: float | None = None
) -> dict[str, Any]:
    """Everything ``prewarm status`` shows for one engine."""
    now = time.time() if now is None else now
    name = engine.name
    last_tick = _json(store.get(redis_keys.LOOP_LAST_TICK.format(engine=name)))
    plans = {
        (k.decode() if isinstance(k, bytes) else k): json.loads(v)
        for k, v in store.hgetall(redis_keys.LOOP_LAST_PLANS.format(engine=name)).items()
    }
    latest = max(plans.values(), key=lambda o: o.get("started", 0), default=None)
    next_tick = store.get(redis_keys.LOOP_NEXT_TICK.format(engine=name))
    return {
        "engine": name,
        "fleet": engine.fleet,
        "url": redacted(engine.url),
        "sources": sources_status(settings, store, name),
        "observations": Observations(settings.data_dir, name).version().to_dict(),
        "model": model_version(settings, name),
        "last_tick": plan_progress(store, last_tick),
        "last_plan": plan_progress(store, latest),
        "next_tick_in_s": None if next_tick is None else round(float(next_tick) - now, 1),
        # what the replica was found holding after its plans, whichever plan sent it there
        "holds": replica_holdings.summary(store, name),
    }


def loop_status(settings: Settings, store: Store) -> dict[str, Any]:
    """Status of every engine (each fleet's replicas among them), every fleet, the periodic
    tasks that are failing, and overall health."""
    current = fleet_settings(settings, store)
    engines = [engine_status(current, store, e) for e in current.engines]
    failing = failing_tasks(store)
    broken = {e["engine"]: e["last_tick"]["error"] for e in engines
              if e["last_tick"] and e["last_tick"].get("status") == "failed"}  # fmt: skip
    return {"healthy": not failing and not broken, "failing_tasks": failing,
            "failing_engines": broken, "window_s": settings.schedule.window_s,
            "engines": engines, "fleets": fleet_status(settings, store)}  # fmt: skip


def loop_problems(settings: Settings, store: Store) -> list[str]:
    """One line per thing that makes the loop unhealthy (empty: healthy)."""
    status = loop_status(settings, store)
    lines = [f"periodic task {t} failed: {e}" for t, e in status["failing_tasks"].items()]
    lines += [f"engine {n}: last tick failed: {e}" for n, e in status["failing_engines"].items()]
    return lines
