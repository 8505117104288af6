"""The warm-up loop, per engine: read → observe → forecast → plan → warm → record the outcome.

:class:`WarmLoop` is the service; tasks (``tasks.loop_tasks``) and the demo call it. One step,
:meth:`WarmLoop.warm_now`, serves every reason that warms an engine from what it served:

* ``window`` — the window tick on beat (:meth:`WarmLoop.tick`), once per ``schedule.window_s``;
* ``replica`` — a replica became ready or restarted: the same plan (the forecast's hottest
  prefixes within its capacity), plus its workload shapes and configured adapters;
* ``trigger`` — a cold-cache trigger fired (hit-rate drop, spike, drift);
* ``demo`` / ``cli`` — a person asked.

Each first reads what is new in the engine's sources (so a restart seconds after traffic still
sees that traffic), then plans with the one planner (:func:`tasks.services.planning.plan_for`) on
the engine's observations and forecaster, and submits the plan as WAL transactions. An engine
that does not answer gets no plan, and its status says so. Outcomes (planned, warmed,
verified, failed, tokens, seconds) are kept in the store for ``prewarm status``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from models.persistence import current_version
from pipeline.errors import BadInputError, PrewarmError
from pipeline.planner.candidates import configured_adapter_items
from pipeline.planner.plan import WarmPlan
from pipeline.records import records_frame
from pipeline.triggers import TriggerEvent, drift_events
from pipeline.window_outcome import request_items
from tasks.adapters import telemetry
from tasks.adapters.connections import check_engine_url
from tasks.adapters.cooldowns import TRIGGER_COOLDOWN_S, cooldown_allows
from tasks.adapters.loop_state import LoopState
from tasks.adapters.observations import Observations, ObservationsVersion, models_root
from tasks.adapters.sources import NewData, read_new
from tasks.adapters.store import Store
from tasks.services import planning
from tasks.services.planning import plan_request
from tasks.services.rewarm import update_template_hotness
from tasks.settings import EngineSettings, Settings

log = logging.getLogger(__name__)

#: A plan submitter: (plan, engine name) → plan id. Production: ``tasks.warm_tasks.submit_plan``.
Submit = Callable[[WarmPlan, str], str]


@dataclass
class Outcome:
    """What one warm-up of one engine did (JSON in the store)."""

    engine: str
    reason: str
    started: float
    status: str = "started"
    window: str | None = None
    seconds: float = 0.0
    observations: dict[str, Any] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None
    forecast: str | None = None
    plan_id: str | None = None
    planned: int = 0
    tokens: int = 0
    error: str | None = None
    #: cold-cache triggers this warm-up saw fire (a window tick: key drift of the last window)
    triggers: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def window_start(now: float, window_s: int) -> float:
    """Start of the window ``now`` falls in (windows are aligned to the epoch)."""
    return now - now % window_s


def window_name(start: float) -> str:
    return pd.Timestamp(start, unit="s", tz="UTC").isoformat()


class WarmLoop:
    """The loop's steps for the engines of ``settings``; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        submit: Submit,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.state = LoopState(store)
        self.submit = submit
        self.clock = clock

    # --- the steps ----------------------------------------------------------------------------

    def observe(self, engine: EngineSettings) -> tuple[ObservationsVersion, NewData]:
        """Read what is new in the engine's sources and add it to its observations."""
        lock = self.state.observations_lock(engine.name)
        if not lock.acquire():
            raise BadInputError("another process holds its observations", where=engine.name)
        try:
            new = read_new(self.settings, self.store, engine)
            loop = self.settings.loop
            version = Observations(self.settings.data_dir, engine.name).append(
                new.records, new.counts, loop.keep_records, loop.keep_windows
            )
        finally:
            lock.release()
        return version, new

    def model_in_use(self, engine: EngineSettings, version: ObservationsVersion) -> str | None:
        """The engine's saved forecaster version; one is fitted and saved first when there is
        none and the observations have enough windows. None: the planner uses frequency."""
        root = models_root(self.settings.data_dir, engine.name)
        if not root.exists() and version.windows < self.settings.loop.min_windows_for_model:
            return None
        # Imported here, not at the top: they load LightGBM (seconds on a small machine), which
        # a loop planning on frequency never needs.
        from models.forecaster import SAVED_NAME
        from tasks.services.training import train_and_save

        if not (root / SAVED_NAME).exists():
            if version.windows < self.settings.loop.min_windows_for_model:
                return None
            counts = Observations(self.settings.data_dir, engine.name).counts_path
            try:
                train_and_save(counts, root)
            except (PrewarmError, ValueError) as exc:  # too little to learn: frequency
                log.info("engine %s: no forecaster fitted (%s)", engine.name, exc)
                return None
        return current_version(root, SAVED_NAME)

    def plan(self, engine: EngineSettings, reason: str, shapes: bool = False) -> WarmPlan | None:
        """The one planner's plan for ``engine`` on its observations (None: nothing seen)."""
        observations = Observations(self.settings.data_dir, engine.name)
        records = observations.records()
        if records is None or records.empty:
            if reason != "replica" or not engine.adapters:
                return None
            records = records_frame([])  # nothing served yet: a replica still gets its adapters
        root = models_root(self.settings.data_dir, engine.name)
        # A model only where one is saved or can be fitted: else the frequency estimate, without
        # loading the learning libraries at all (seconds on a small machine).
        learnable = root.exists() or (
            observations.version().windows >= self.settings.loop.min_windows_for_model
        )
        counts = (
            observations.counts_path if learnable and observations.counts_path.exists() else None
        )
        request = plan_request(self.settings, engine.name, shapes=shapes)
        plan = planning.plan_for(
            records, request, reason=reason, windows=counts, engine=engine, models_root=root,
            forecast="auto" if counts is not None else "frequency",
        )  # fmt: skip
        return with_configured_adapters(plan, engine) if reason == "replica" else plan

    def key_drift(self, engine: EngineSettings, closed_before: float) -> TriggerEvent | None:
        """A key-drift event when the last closed window's prefix keys moved away from the
        windows before it (past the trigger's cooldown), else None."""
        counts = Observations(self.settings.data_dir, engine.name).counts()
        if counts is None or counts.empty:
            return None
        events = drift_events(counts, "prefix", engine.name)
        last = events[-1] if events else None
        if last is None or last.ts < closed_before - 2 * self.settings.schedule.window_s:
            return None
        return last if cooldown_allows(self.store, last, TRIGGER_COOLDOWN_S) else None

    def update_hotness(self, engine: EngineSettings) -> None:
        """Template hotness from the engine's kept records (for "hottest last" re-warms)."""
        records = Observations(self.settings.data_dir, engine.name).records()
        if records is not None:
            update_template_hotness(self.settings, self.store, engine, records["prompt"])

    def warm_now(self, engine_name: str, reason: str, window: str | None = None) -> dict[str, Any]:
        """Read, observe, plan for ``reason`` and submit; returns the recorded outcome."""
        engine = self.settings.engine(engine_name)
        outcome = Outcome(engine.name, reason, self.clock(), window=window)
        try:
            self._warm(engine, outcome)
        except PrewarmError as exc:
            outcome.status, outcome.error = "failed", str(exc)
            raise
        finally:
            outcome.seconds = round(self.clock() - outcome.started, 3)
            self.record(outcome)
        return outcome.to_dict()

    def _warm(self, engine: EngineSettings, outcome: Outcome) -> None:
        version, new = self.observe(engine)
        outcome.observations = version.to_dict()
        outcome.sources = [r.to_dict() for r in new.reads]
        if self.settings.template_repos and len(new.records):
            self.update_hotness(engine)
        try:
            check_engine_url(engine.url)
        except PrewarmError as exc:
            outcome.status = f"engine down: no plan ({exc})"
            return
        outcome.model = self.model_in_use(engine, version)
        if outcome.reason == "window" and new.counts is not None and len(new.counts):
            drift = self.key_drift(engine, outcome.started)
            outcome.triggers = [drift.to_dict()] if drift is not None else []
        plan = self.plan(engine, outcome.reason, shapes=outcome.reason == "replica")
        if plan is None or not plan.items:
            outcome.status = "nothing to warm yet" if plan is None else "plan empty"
            return
        outcome.forecast = next((n for n in plan.notes if n.startswith("forecast:")), None)
        outcome.planned, outcome.tokens = len(plan.items), sum(i.tokens for i in plan.items)
        outcome.plan_id = self.submit(plan, engine.name)
        outcome.status = "submitted"
        self._keep_recent_plans(engine.name, plan.plan_id)

    def tick(self, engine_name: str, now: float | None = None) -> dict[str, Any] | None:
        """The window tick: once per engine and window, whoever runs it (None: already done)."""
        window_s = self.settings.schedule.window_s
        start = window_start(self.clock() if now is None else now, window_s)
        name = window_name(start)
        if not self.state.claim_window(engine_name, start):
            return None
        self.state.set_next_tick(engine_name, start + window_s)
        try:
            outcome = self.warm_now(engine_name, "window", window=name)
        except PrewarmError:
            self.state.release_window(engine_name, start)  # a retry may run it again
            telemetry.record_tick(self.store, engine_name, False, window_s, now=self.clock())
            raise
        telemetry.record_tick(self.store, engine_name, True, window_s, now=self.clock())
        self.close_window(engine_name, (start - window_s, start))
        return outcome

    def close_window(self, engine_name: str, window: tuple[float, float]) -> None:
        """The window that just closed, for coverage, misses and forecast error: its requests
        per item (the deepest planned block of each request's chain) against what was warmed."""
        records = Observations(self.settings.data_dir, engine_name).records()
        if records is None or records.empty or "prefix_hashes" not in records:
            return
        epoch = pd.Timestamp(0, tz="UTC")
        ts = (pd.to_datetime(records["ts"], utc=True) - epoch) / pd.Timedelta(seconds=1)
        inside = records[(ts >= window[0]) & (ts < window[1])]
        if inside.empty:
            return
        known = telemetry.warm_state(self.store, engine_name).planned
        observed = request_items(inside["prefix_hashes"], known)
        seen = {h for chain in records[ts < window[0]]["prefix_hashes"].dropna() for h in chain}
        telemetry.record_window(self.store, engine_name, window, observed, seen)

    # --- records for status -------------------------------------------------------------------

    def record(self, outcome: Outcome) -> None:
        body = json.dumps(outcome.to_dict(), default=str)
        self.state.record_outcome(outcome.engine, outcome.reason, body, outcome.reason == "window")

    def _keep_recent_plans(self, engine: str, plan_id: str) -> None:
        self.state.keep_recent_plans(engine, plan_id, self.settings.loop.keep_plans)


def with_configured_adapters(plan: WarmPlan, engine: EngineSettings) -> WarmPlan:
    """A replica's plan plus the adapters configured for its engine that the plan lacks, first
    (they hold no prefix, so they cost no cache and order nothing). The planner adds only the
    adapters its records used; configured ones are a replica's own."""
    planned = {item.adapter for item in plan.items if item.kind == "adapter"}
    names = (a.split("=", 1)[0] for a in engine.adapters)
    extra = configured_adapter_items((n for n in names if n not in planned), engine.model)
    return replace(plan, items=(*extra, *plan.items)) if extra else plan
