"""The warm-up loop, per engine: read → observe → forecast → plan → warm → record the outcome.

:class:`WarmLoop` is the service; tasks (``tasks.loop_tasks``) and the demo call it. One step,
:meth:`WarmLoop.warm_now`, serves every reason that warms an engine from what it served:

* ``window`` — the window tick on beat (:meth:`WarmLoop.tick`), once per ``schedule.window_s``;
* ``replica`` — a replica became ready or restarted: the same plan (the forecast's hottest
  prefixes within its capacity), plus its workload shapes and configured adapters;
* ``trigger`` — a cold-cache trigger fired (hit-rate drop, spike, drift);
* ``demo`` / ``cli`` — a person asked.

Each first reads what is new in the engine's sources (so a restart seconds after traffic still
sees that traffic) into an observations snapshot that every later step receives (model, drift,
plan, window close: each observation file is read once per warm-up), then plans with the one
planner (:func:`tasks.services.planning.plan_for`) on
the engine's observations and forecaster, and submits the plan as WAL transactions. An engine
that does not answer gets no plan, and its status says so. Outcomes (planned, warmed,
verified, failed, tokens, seconds) are kept in the store for ``prewarm status``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from models.persistence import current_version
from pipeline.errors import BadInputError, PrewarmError
from pipeline.gateway_answers import cache_answers
from pipeline.kv_holdings import restore_candidates
from pipeline.planner.candidates import configured_adapter_items
from pipeline.planner.plan import WarmItem, WarmPlan
from pipeline.planner.reasons import PlanReason
from pipeline.planner.recency import weigh_counts
from pipeline.records import records_frame
from pipeline.triggers import TriggerEvent, drift_events
from tasks.adapters import problems, telemetry
from tasks.adapters.connections import check_engine_url
from tasks.adapters.cooldowns import cooldown_allows
from tasks.adapters.kv_state import counts_after, load_holdings
from tasks.adapters.loop_state import LoopState
from tasks.adapters.model_shelf import checked_out
from tasks.adapters.observations import Observations, ObservationsSnapshot, merge_counts
from tasks.adapters.shared_store import SharedStoreUnavailable, counts_since, shared_store
from tasks.adapters.sources import NewData, read_new
from tasks.adapters.store import Store
from tasks.services import planning
from tasks.services.fleet_records import fleet_records, read_siblings_first, record_siblings
from tasks.services.planning import plan_request
from tasks.services.rewarm import update_template_hotness
from tasks.services.window_close import close_window
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
    #: what this warm-up cost the shared store: requests by kind, bytes read and written
    store_requests: dict[str, Any] = field(default_factory=dict)

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

    def observe(self, engine: EngineSettings) -> tuple[ObservationsSnapshot, NewData]:
        """Read what is new in the engine's sources and add it to its observations; the
        snapshot every later step of this warm-up works on."""
        lock = self.state.observations_lock(engine.name)
        if not lock.acquire():
            raise BadInputError("another process holds its observations", where=engine.name)
        try:
            new = read_new(self.settings, self.store, engine)
            snapshot = self._append(engine, new)
        finally:
            lock.release()
        return snapshot, new

    def _append(self, engine: EngineSettings, new: NewData) -> ObservationsSnapshot:
        """Add what was read (and what an earlier tick could not write) to the observations.
        While the shared store does not answer, it is kept in Redis and the engine is marked
        (``prewarm status`` degraded) until a tick writes it: no observation is lost."""
        pending_records, pending_counts = self.state.pending(engine.name)
        records = _concat(pending_records, new.records)
        counts = merge_counts(pending_counts, new.counts)
        try:
            kv_counts, kv_last = self.kv_counts(engine)
            loop = self.settings.loop
            snapshot = Observations(self.settings.data_dir, engine.name).append(
                records, merge_counts(counts, kv_counts), loop.keep_records, loop.keep_windows
            )
        except SharedStoreUnavailable as exc:
            self.state.keep_pending(engine.name, records, counts)
            problems.mark(self.store, problems.SHARED_STORE_DOWN, engine.name, str(exc),
                          self.clock())  # fmt: skip
            raise
        if pending_records is not None or pending_counts is not None:
            self.state.clear_pending(engine.name)
        problems.mark(self.store, problems.SHARED_STORE_DOWN, engine.name, None, self.clock())
        if kv_last is not None:
            self.state.set_kv_window(engine.name, kv_last)
        return snapshot

    def kv_counts(self, engine: EngineSettings) -> tuple[pd.DataFrame | None, float | None]:
        """The windows of ``engine``'s KV-event counts not yet in its observations (written by
        its ``prewarm kv-events`` follower: the uses of each chain it held), and the last
        window's start: how a replica that logs no prompts (vLLM at INFO) is observed."""
        if self.settings.kv_events_of(engine.name) is None:
            return None, None
        return counts_after(self.settings.data_dir, engine.name, self.state.kv_window(engine.name))

    def kv_candidates(self, engine: EngineSettings, window: str | None) -> list[WarmItem]:
        """The chains ``engine`` held, by its KV events (its follower's last snapshot), and
        those of the replicas whose records its plan combines (:func:`record_siblings`), as
        candidates primed with their token ids: a replica that logs no prompts is planned for
        from these. (On real vLLM, a gated replica planned from its own held 5 of the 6
        templates its fleet served, and a user of the sixth missed.)"""
        names = [engine.name] + [e.name for e in record_siblings(self.settings, engine, window)]
        found: dict[str, WarmItem] = {}
        for name in names:
            if self.settings.kv_events_of(name) is None:
                continue
            loaded = load_holdings(self.settings.data_dir, name)
            held = [] if loaded is None else restore_candidates(loaded[0], engine.model)
            found.update((item.key, item) for item in held if item.key not in found)
        return list(found.values())

    def models(self, engine: EngineSettings) -> AbstractContextManager[Path]:
        """The engine's models folder for one warm-up (:mod:`tasks.adapters.model_shelf`)."""
        return checked_out(self.settings.data_dir, engine.name, self.settings.host_dir)

    def learnable(self, root: Path, snapshot: ObservationsSnapshot) -> bool:
        """Whether a forecaster can be used: one is saved under ``root``, or the snapshot has
        enough windows to fit one (``loop.min_windows_for_model``, the one threshold)."""
        saved = root.is_dir() and any(root.iterdir())
        return saved or snapshot.windows >= self.settings.loop.min_windows_for_model

    def model_in_use(
        self, engine: EngineSettings, snapshot: ObservationsSnapshot, root: Path,
        refit: bool = False,
    ) -> str | None:  # fmt: skip
        """The engine's saved forecaster version; one is selected by backtest on the snapshot's
        counts and saved first when there is none (or ``refit``: a drift was found) and the
        snapshot has enough windows. None: the planner uses the frequency estimate."""
        if not self.learnable(root, snapshot):
            return None
        # Imported here, not at the top: it loads LightGBM (seconds on a small machine), which
        # a loop planning on frequency never needs.
        from models.forecaster import SAVED_NAME

        saved = (root / SAVED_NAME).exists()
        if (refit or not saved) and not self._fit_forecaster(engine, snapshot, root) and not saved:
            return None
        return current_version(root, SAVED_NAME)

    def _fit_forecaster(
        self, engine: EngineSettings, snapshot: ObservationsSnapshot, root: Path
    ) -> bool:
        """Select a forecaster by backtest on the snapshot's counts and save it (False: too
        few windows, or too little to learn)."""
        from models.persistence import code_version
        from tasks.services.training import train_on_counts

        if snapshot.counts is None or snapshot.windows < self.settings.loop.min_windows_for_model:
            return False
        source = f"observations:{engine.name}:{snapshot.version.version}/{code_version()}"
        try:
            train_on_counts(snapshot.counts, source, root)
        except (PrewarmError, ValueError) as exc:  # too little to learn: frequency
            log.info("engine %s: no forecaster fitted (%s)", engine.name, exc)
            return False
        return True

    def plan(
        self, engine: EngineSettings, reason: str, snapshot: ObservationsSnapshot, root: Path,
        window: str | None = None,
    ) -> WarmPlan | None:  # fmt: skip
        """The one planner's plan for ``engine`` on ``snapshot`` (None: nothing seen). A
        replica's plan has its workload shapes, and its configured adapters as ``extra``; the
        requests its gateways' clients repeat are ``extra`` of every plan. A fleet's replica
        plans from the records of its fleet's road (:mod:`tasks.services.fleet_records`; the
        window tick of ``window``: those its fleet's replicas share in that window)."""
        replica = reason == PlanReason.REPLICA
        fleet = fleet_records(self.settings, engine, snapshot.records, window)
        records = fleet.records
        held: list[WarmItem] = []
        if records is None or records.empty:
            held = self.kv_candidates(engine, window)  # logs no prompts: KV events
            if not held and (not replica or not engine.adapters):
                return None
            records = records_frame([])  # nothing logged: its held chains, a replica's adapters
        counts = snapshot.counts if self.learnable(root, snapshot) else None
        since = self.newest_since(engine)
        if counts is not None:
            counts = weigh_counts(counts, since)
        request = replace(plan_request(self.settings, engine.name, shapes=replica),
                          newest_since=since)  # fmt: skip
        extra = configured_adapters(engine) if replica else []
        gateway_items, gateway_notes, intent_windows = planning.gateway_candidates_noted(
            self.settings, engine.name, records
        )
        extra += gateway_items
        if window is not None:  # a window tick: the semantic gateways' last closed window
            closed = pd.Timestamp(window).timestamp() - self.settings.schedule.window_s
            telemetry.record_intents(self.store, engine.name,
                                     [w for w in intent_windows if w.start == closed],
                                     now=self.clock())  # fmt: skip
        plan = planning.plan_for(
            records, request, reason=reason, windows=counts, engine=engine,
            models_root=root,
            forecast="auto" if counts is not None else "frequency",
            min_windows=self.settings.loop.min_windows_for_model,
            extra=[*extra, *held], detect=fleet.detect,
        )  # fmt: skip
        notes = [fleet.note] if fleet.note else []
        notes += [f"candidates: {len(held)} chains held by its KV events"] if held else []
        notes += gateway_notes
        return replace(plan, notes=(*plan.notes, *notes)) if notes else plan

    def key_drift(
        self, engine: EngineSettings, snapshot: ObservationsSnapshot, closed_before: float
    ) -> TriggerEvent | None:
        """A key-drift event when the last closed window's prefix keys moved away from the
        windows before it (past the trigger's cooldown), else None."""
        counts = snapshot.counts
        if counts is None or counts.empty:
            return None
        events = drift_events(counts, "prefix", engine.name)
        last = events[-1] if events else None
        if last is None or last.ts < closed_before - 2 * self.settings.schedule.window_s:
            return None
        return last if cooldown_allows(self.store, last) else None

    def topic_drift(
        self, engine: EngineSettings, snapshot: ObservationsSnapshot, records: pd.DataFrame,
        closed_before: float,
    ) -> TriggerEvent | None:  # fmt: skip
        """Add the topic mix of ``records`` (what this tick read) to the engine's history; a
        topic-drift event of the last closed window past its cooldown, else None. An event is
        answered here: plans weight the windows from the drifted one on for
        ``topics.weight_windows`` windows, and the topics are fitted again."""
        topics = self.settings.topics
        if not topics.enabled or records.empty:
            return None
        # Imported here, not at the top: the topics load scikit-learn, and their embedder
        # torch (seconds and hundreds of MiB), which a loop without topic drift never needs.
        from tasks.services.topic_drift import TopicWatch

        with self.models(engine) as root:
            watch = TopicWatch(self.settings, engine.name, root=root)
            watch.observe(records)
            event = watch.event(closed_before)
            if event is None or not cooldown_allows(self.store, event):
                return None
            until = closed_before + topics.weight_windows * self.settings.schedule.window_s
            self.state.set_drift(engine.name, event.ts, until, event.kind)
            watch.refit(snapshot.records, event.ts)
        return event

    def newest_since(self, engine: EngineSettings) -> float | None:
        """Where the newest windows begin while a drift is being answered (Unix seconds),
        else None."""
        drift = self.state.drift(engine.name)
        if drift is None or self.clock() >= float(drift["until"]):
            return None
        return float(drift["since"])

    def warm_now(self, engine_name: str, reason: str, window: str | None = None) -> dict[str, Any]:
        """Read, observe, plan for ``reason`` and submit; returns the recorded outcome."""
        return self._warm_recorded(self.settings.engine(engine_name), reason, window)[0]

    def _warm_recorded(
        self, engine: EngineSettings, reason: str, window: str | None
    ) -> tuple[dict[str, Any], ObservationsSnapshot | None]:
        outcome = Outcome(engine.name, reason, self.clock(), window=window)
        snapshot = None
        counts = shared_store(self.settings.data_dir).counts
        before = counts.snapshot()
        try:
            snapshot = self._warm(engine, outcome)
        except PrewarmError as exc:
            outcome.status, outcome.error = "failed", str(exc)
            raise
        finally:
            outcome.seconds = round(self.clock() - outcome.started, 3)
            outcome.store_requests = counts_since(before, counts.snapshot())
            self.record(outcome)
        return outcome.to_dict(), snapshot

    def _warm(self, engine: EngineSettings, outcome: Outcome) -> ObservationsSnapshot:
        snapshot, new = self.observe(engine)
        if outcome.reason != PlanReason.WINDOW:
            read_siblings_first(self.settings, engine, self.observe)
        answers = cache_answers(new.records, self.settings.schedule.window_s)
        telemetry.record_gateway(self.store, engine.name, answers, now=self.clock())
        outcome.observations = snapshot.version.to_dict()
        outcome.sources = [r.to_dict() for r in new.reads]
        if self.settings.template_repos and len(new.records) and snapshot.records is not None:
            update_template_hotness(self.settings, self.store, engine, snapshot.records["prompt"])
        window = outcome.reason == PlanReason.WINDOW
        # every window's topics are observed, an engine that is down or not
        topic = self.topic_drift(engine, snapshot, new.records, outcome.started) if window else None
        try:
            check_engine_url(engine.url)
        except PrewarmError as exc:
            outcome.status = f"engine down: no plan ({exc})"
            return snapshot
        if window and new.counts is not None and len(new.counts):
            drift = self.key_drift(engine, snapshot, outcome.started)
            outcome.triggers = [drift.to_dict()] if drift is not None else []
        outcome.triggers += [topic.to_dict()] if topic is not None else []
        with self.models(engine) as root:
            outcome.model = self.model_in_use(engine, snapshot, root, refit=topic is not None)
            plan = self.plan(engine, outcome.reason, snapshot, root,
                             outcome.window if window else None)  # fmt: skip
        if plan is None or not plan.items:
            outcome.status = "nothing to warm yet" if plan is None else "plan empty"
            if outcome.reason == PlanReason.WINDOW:  # nothing was predicted for the window
                self.state.set_window_predictions(engine.name, {})
            return snapshot
        outcome.forecast = next((n for n in plan.notes if n.startswith("forecast:")), None)
        outcome.planned, outcome.tokens = len(plan.items), sum(i.tokens for i in plan.items)
        outcome.plan_id = self.submit(plan, engine.name)
        outcome.status = "submitted"
        self._keep_recent_plans(engine.name, plan.plan_id)
        if outcome.reason == PlanReason.WINDOW:  # what the window's close is measured against
            predicted = {item.key: item.predicted_hits for item in plan.items}
            self.state.set_window_predictions(engine.name, predicted)
        return snapshot

    def tick(self, engine_name: str, now: float | None = None) -> dict[str, Any] | None:
        """The window tick: once per engine and window, whoever runs it (None: already done).

        It warms for the window that begins and closes the one that ended, on the snapshot it
        observed, against what the previous tick's plan predicted for it."""
        window_s = self.settings.schedule.window_s
        start = window_start(self.clock() if now is None else now, window_s)
        name = window_name(start)
        if not self.state.claim_window(engine_name, start):
            return None
        self.state.set_next_tick(engine_name, start + window_s)
        predicted = self.state.window_predictions(engine_name)
        try:
            outcome, snapshot = self._warm_recorded(
                self.settings.engine(engine_name), PlanReason.WINDOW, name
            )
        except PrewarmError:
            self.state.release_window(engine_name, start)  # a retry may run it again
            telemetry.record_tick(self.store, engine_name, False, window_s, now=self.clock())
            raise
        telemetry.record_tick(self.store, engine_name, True, window_s, now=self.clock())
        if snapshot is not None and snapshot.records is not None:
            close_window(self.store, engine_name, (start - window_s, start), snapshot.records,
                         predicted)  # fmt: skip
        return outcome

    # --- records for status -------------------------------------------------------------------

    def record(self, outcome: Outcome) -> None:
        body = json.dumps(outcome.to_dict(), default=str)
        self.state.record_outcome(outcome.engine, outcome.reason, body, outcome.reason == "window")

    def _keep_recent_plans(self, engine: str, plan_id: str) -> None:
        self.state.keep_recent_plans(engine, plan_id, self.settings.loop.keep_plans)


def configured_adapters(engine: EngineSettings) -> list[WarmItem]:
    """Candidates for the adapters configured for ``engine`` (a replica's own: it loads them
    before their first request), the ``extra`` of a replica's plan."""
    return configured_adapter_items((a.split("=", 1)[0] for a in engine.adapters), engine.model)


def _concat(first: pd.DataFrame | None, second: pd.DataFrame | None) -> pd.DataFrame | None:
    frames = [f for f in (first, second) if f is not None and len(f)]
    if not frames:
        return second
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
