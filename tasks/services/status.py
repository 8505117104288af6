"""What the loop is doing, per engine, for ``prewarm status``, the api and health checks.

Read only: the store Redis (source statuses, last tick, last plan per reason and its live
progress, next tick, periodic task health) and the models folder. Nothing here starts work.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from pipeline.errors import BadInputError
from tasks.adapters import problems, redis_keys, replica_holdings
from tasks.adapters.connections import redacted
from tasks.adapters.model_shelf import checked_out, current_pointer
from tasks.adapters.observations import Observations
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.shared_store import SharedStoreUnavailable
from tasks.adapters.sources import SourceStates, source_id
from tasks.adapters.store import Store
from tasks.adapters.task_health import failing_tasks
from tasks.adapters.telemetry import record_unverified
from tasks.services.fleets import fleet_settings, fleet_status
from tasks.services.gate import gate_status
from tasks.settings import EngineSettings, Settings


def _json(raw: bytes | str | None) -> dict[str, Any] | None:
    return json.loads(raw) if raw else None


def model_version(settings: Settings, engine: str) -> str | None:
    """The saved forecaster the engine's plans use — its version and the backtest winner — or
    None (fitted or frequency)."""
    from models.forecaster import SAVED_NAME
    from models.selection import saved_selection

    if current_pointer(settings.data_dir, engine, SAVED_NAME) is None:
        return None
    with checked_out(settings.data_dir, engine, settings.host_dir) as root:
        saved = saved_selection(root, SAVED_NAME)
    return None if saved is None else f"{saved['version']} (winner {saved['winner']})"


def _shared_state(settings: Settings, engine: str) -> dict[str, Any]:
    """The engine's observations version and model from the shared store (while the store
    does not answer: what failed, and the engine is marked by its tick)."""
    try:
        return {"observations": Observations(settings.data_dir, engine).version().to_dict(),
                "model": model_version(settings, engine)}  # fmt: skip
    except SharedStoreUnavailable as exc:
        return {"observations": {"engine": engine, "error": str(exc)}, "model": None}


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


def last_plan(store: Store, engine: str) -> dict[str, Any] | None:
    """The outcome of ``engine``'s latest plan, of whatever reason (None: no plan yet)."""
    plans = [json.loads(v) for v in store.hvals(redis_keys.LOOP_LAST_PLANS.format(engine=engine))]
    return max(plans, key=lambda o: o.get("started", 0), default=None)


def _unverified(progress: dict[str, Any] | None) -> str | None:
    """What is wrong with a plan's progress: items not verified (None: none, or no plan)."""
    if not progress or not progress.get("failed"):
        return None
    return (
        f"last plan {progress['plan_id']} ({progress['reason']}): {progress['failed']} of "
        f"{progress['warmed']} items not verified"
    )


def current_problems(settings: Settings, store: Store, now: float) -> list[problems.Problem]:
    """Every problem now, oldest first: those the fleet looks marked (a router down, replicas
    not found) and each engine's last plan with items not verified, marked here at ``now``
    (with its metric, ``prewarm_plan_items_unverified``)."""
    current = fleet_settings(settings, store)
    unverified = {}
    for engine in current.engines:
        progress = plan_progress(store, last_plan(store, engine.name))
        problems.mark(store, problems.PLAN_UNVERIFIED, engine.name, _unverified(progress), now)
        unverified[engine.name] = int((progress or {}).get("failed") or 0)
    record_unverified(store, unverified)
    subjects = {f.name for f in settings.fleets} | set(unverified)
    return [p for p in problems.current(store) if p.subject in subjects]


def problem_line(problem: problems.Problem, now: float) -> str:
    """One line for ``problem``: what, about what, and since when (UTC, and how long ago)."""
    since = datetime.fromtimestamp(problem.since, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        f"{problem.kind} {problem.subject}: {problem.detail} (since {since}, "
        f"{max(0, round(now - problem.since))}s ago)"
    )


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
    latest = last_plan(store, name)
    next_tick = store.get(redis_keys.LOOP_NEXT_TICK.format(engine=name))
    return {
        "engine": name,
        "fleet": engine.fleet,
        "url": redacted(engine.url),
        "sources": sources_status(settings, store, name),
        **_shared_state(settings, name),
        "last_tick": plan_progress(store, last_tick),
        "last_plan": plan_progress(store, latest),
        "next_tick_in_s": None if next_tick is None else round(float(next_tick) - now, 1),
        # what the replica was found holding after its plans, whichever plan sent it there
        "holds": replica_holdings.summary(store, name),
    }


def loop_status(settings: Settings, store: Store, now: float | None = None) -> dict[str, Any]:
    """Status of every engine (each fleet's replicas among them), every fleet, the periodic
    tasks that are failing, the problems (each since when), and overall health."""
    now = time.time() if now is None else now
    current = fleet_settings(settings, store)
    engines = [engine_status(current, store, e, now) for e in current.engines]
    failing = failing_tasks(store)
    broken = {e["engine"]: e["last_tick"]["error"] for e in engines
              if e["last_tick"] and e["last_tick"].get("status") == "failed"}  # fmt: skip
    found = current_problems(settings, store, now)
    return {"healthy": not failing and not broken and not found, "failing_tasks": failing,
            "failing_engines": broken, "window_s": settings.schedule.window_s,
            "problems": [{**p.to_dict(), "line": problem_line(p, now)} for p in found],
            "engines": engines, "fleets": fleet_status(settings, store),
            "gate": gate_status(settings, store, now)}  # fmt: skip


def loop_problems(settings: Settings, store: Store, now: float | None = None) -> list[str]:
    """One line per failure of prewarm's own periodic work (empty: beat is healthy). A fleet's
    problems (a router down, replicas not found, items not held) are the fleet's, not beat's:
    ``prewarm status`` and the api's ``/health`` report them, and a beat restarted for them by
    its container's probe would fix none."""
    status = loop_status(settings, store, now)
    lines = [f"periodic task {t} failed: {e}" for t, e in status["failing_tasks"].items()]
    lines += [f"engine {n}: last tick failed: {e}" for n, e in status["failing_engines"].items()]
    return lines
