"""The gate (:mod:`pipeline.gate`) at work: a gated fleet's replica takes traffic only once its
hot set is warmed and verified on it.

At each look (:meth:`Gatekeeper.look`) every replica of a gated fleet is probed at its own URL
(``/health`` and its process start time). One that answers as a new engine process — never
seen, back from down, or restarted between two looks — is removed from the router's worker list
first (``gate_by = "router"``), then warmed *directly* with the loop's replica plan (the fleet's
hot set within its capacity; :func:`pipeline.fleet_roads.on_replica`), sent ahead of routine
work (a replica's plan goes at the urgent priority). Once the plan is done, each item it
verified is checked held on the replica (:func:`tasks.services.holdings.check_replica`, the
post-plan check); all held, it is added to the router's list and answers Ready. A plan that
failed is sent again at the next look; at ``gate_deadline_s`` the replica is admitted cold.

The sidecar (``prewarm gate``) and the benchmark look at one replica every few tens of
milliseconds and run the warm-up in their own process (:func:`run_here`); ``prewarm watch``
looks at every gated fleet at its interval and sends the plans to the workers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pipeline.errors import PrewarmError
from pipeline.fleet_roads import on_replica
from pipeline.gate import (
    GateRecord,
    GateState,
    admitted,
    is_new_process,
    new_episode,
    past_deadline,
    readiness,
)
from pipeline.planner.plan import WarmPlan
from pipeline.planner.reasons import PlanReason
from pipeline.triggers import REPLICA_READY, REPLICA_RESTARTED
from tasks.adapters import gate_state, problems
from tasks.adapters.engine_probe import probe_replica
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.router_client import RouterClient
from tasks.adapters.store import Store
from tasks.adapters.targets.base import WarmOptions
from tasks.adapters.telemetry import record_gate
from tasks.services.batch_runner import BatchRunner
from tasks.services.holdings import Holdings, check_replica, verified_items
from tasks.services.loop import Submit, WarmLoop
from tasks.services.replica_watch import WarmNow
from tasks.settings import EngineSettings, Settings
from tasks.settings.fleets import FleetSettings

logger = logging.getLogger(__name__)

#: seconds one look may hold a replica (planning and dispatch; where the plan runs in the
#: look's process, its run too): two processes never begin one episode twice
LOOK_HOLD_S = 60.0
#: seconds between two warm-ups of a replica whose warm-up failed (or was not verified): a
#: sidecar looks every 50 ms
RETRY_S = 1.0
#: (engine) -> (answers /health, its process start time)
Probe = Callable[[EngineSettings], tuple[bool, float | None]]
RouterFor = Callable[[FleetSettings], RouterClient]


@dataclass
class Timings:
    """Seconds of the last submission's dispatch and (where it ran here) its run."""

    dispatch: float = 0.0
    warm: float | None = None


def run_here(settings: Settings, store: Store, timings: Timings | None = None) -> Submit:
    """A submitter that runs a plan's batches in this process, one after the other, and
    marks it finished (the sidecar's and the benchmark's: no worker needed)."""

    def submit(plan: WarmPlan, engine: str) -> str:
        started = time.perf_counter()
        plans = PlanStore(store)
        options = WarmOptions(plan.budget.batch_size, ordered=True, road=plan.road)
        batches = plans.save(plan, engine, options)
        dispatched = time.perf_counter()
        runner = BatchRunner(store, settings)
        for batch in range(batches):
            runner.run(plan.plan_id, batch)
        plans.mark_finished(plan.plan_id)
        if timings is not None:
            timings.warm = time.perf_counter() - dispatched
            timings.dispatch = dispatched - started
        return plan.plan_id

    return submit


def gated_engines(settings: Settings) -> set[str]:
    """The engine names of every gated fleet's replicas (``settings``: with their current
    replicas)."""
    return {e.name for f in settings.fleets if f.gate for e in settings.replicas_of(f.name)}


def leave_gated_start_ups(warm: WarmNow, gated: set[str]) -> WarmNow:
    """``warm``, but the start-up of a replica in ``gated`` is the gate's (it warmed the
    replica before admitting it): not warmed again as a trigger."""

    def unless_gated(engine: str, kind: str) -> dict[str, Any]:
        if engine in gated and kind in (REPLICA_READY, REPLICA_RESTARTED):
            return {"gate": "warmed by the gate before it was admitted"}
        return warm(engine, kind)

    return unless_gated


class Gatekeeper:
    """The gate's looks at the replicas of ``settings``' gated fleets (with their current
    replicas as engines); ``submit`` sends each warm-up (:func:`run_here`, or the workers')."""

    def __init__(
        self, settings: Settings, store: Store, submit: Submit, *,
        router_for: RouterFor = RouterClient, probe: Probe = probe_replica,
        clock: Callable[[], float] = time.time, timings: Timings | None = None,
    ) -> None:  # fmt: skip
        """``timings``: what ``submit`` times itself (:func:`run_here`'s), else the call."""
        self.settings, self.store, self.clock = settings, store, clock
        self.router_for, self.probe = router_for, probe
        self.send, self.timings = submit, timings or Timings()
        self.submit_s = 0.0

    def submit(self, plan: WarmPlan, engine: str) -> str:
        """Send ``plan`` on the replica's own URL, timed."""
        self.timings.warm = None
        started = self.clock()
        try:
            return self.send(on_replica(plan), engine)
        finally:
            self.submit_s = self.clock() - started

    def prepare(self) -> None:
        """Import what a first plan imports when it needs it (the workload profiles: scikit-
        learn and SciPy, seconds on a small machine), so a sidecar started with its pod pays
        for it while its engine loads a model, not while the replica waits."""
        import models.profiles  # noqa: F401 (imported for its cost, now)

    def gated(self) -> list[FleetSettings]:
        """The fleets with ``gate = true``."""
        return [fleet for fleet in self.settings.fleets if fleet.gate]

    def gated_engines(self) -> set[str]:
        """The engine names of every gated fleet's replicas."""
        return gated_engines(self.settings)

    def look(self, only: str | None = None) -> list[GateRecord]:
        """One look at every gated replica (``only``: that engine); their records."""
        records = []
        for fleet in self.gated():
            replicas = [e for e in self.settings.replicas_of(fleet.name)
                        if only is None or e.name == only]  # fmt: skip
            seen = [self._look_at(fleet, engine) for engine in replicas]
            records += [record for _, record in seen if record is not None]
            self._record(fleet, seen)
        return records

    def _look_at(
        self, fleet: FleetSettings, engine: EngineSettings
    ) -> tuple[GateRecord | None, GateRecord | None]:
        """(the replica's record before, after) one look; after None: not looked at (never
        seen up, or another process looks at it now)."""
        if not gate_state.claim(self.store, fleet.name, engine.name, LOOK_HOLD_S):
            return None, None
        try:
            last = gate_state.load(self.store, fleet.name, engine.name)
            return last, self.step(fleet, engine, last)
        finally:
            gate_state.release(self.store, fleet.name, engine.name)

    def _record(
        self, fleet: FleetSettings, seen: list[tuple[GateRecord | None, GateRecord | None]]
    ) -> None:
        """The looked-at replicas' states, those admitted now, and the fleet's waiting count
        (over all its current replicas, whoever looked at them) for ``/metrics``."""
        looked = [(last, record) for last, record in seen if record is not None]
        states = {record.engine: record.state.value for _, record in looked}
        admitted_now = [
            (record.time_to_ready or 0.0, record.prewarm_part(),
             record.state == GateState.ADMITTED_COLD)
            for last, record in looked
            if record.admitted is not None and (last is None or last.admitted != record.admitted)
        ]  # fmt: skip
        current = {e.name for e in self.settings.replicas_of(fleet.name)}
        waiting = sum(r.state == GateState.WAITING and r.engine in current
                      for r in gate_state.fleet_records(self.store, fleet.name))  # fmt: skip
        record_gate(self.store, fleet.name, states, waiting, admitted_now)

    def step(
        self, fleet: FleetSettings, engine: EngineSettings, last: GateRecord | None
    ) -> GateRecord | None:
        """One look at one gated replica: its record after the look (None: never seen up)."""
        started = self.clock()
        up, start_time = self.probe(engine)
        if not up:
            return self._down(fleet, engine, last)
        if is_new_process(last, start_time):
            record = new_episode(fleet.name, engine.name, engine.url, started, start_time)
            self._remove(fleet, engine)
            record = self._warm(record.with_stage("detection", self.clock() - started))
        elif last is not None and last.state == GateState.WAITING:
            record = last if last.plan_id is not None or self._too_soon(last) else self._warm(last)
        else:
            return last
        record = self._verify(record, engine)
        if past_deadline(record, self.clock(), fleet.gate_deadline_s):
            record = self._admit_cold(fleet, engine, record)
        gate_state.save(self.store, record)
        return record

    # --- the steps ------------------------------------------------------------------------------

    def _down(
        self, fleet: FleetSettings, engine: EngineSettings, last: GateRecord | None
    ) -> GateRecord | None:
        if last is None or last.state == GateState.DOWN:
            return last
        self._remove(fleet, engine)
        record = replace(last, state=GateState.DOWN, why="does not answer /health")
        gate_state.save(self.store, record)
        return record

    def _too_soon(self, record: GateRecord) -> bool:
        """Whether a failed warm-up was tried less than :data:`RETRY_S` ago."""
        return record.tried_at is not None and self.clock() - record.tried_at < RETRY_S

    def _warm(self, record: GateRecord) -> GateRecord:
        """Plan the replica's hot set and send it to the replica (timed)."""
        started = self.clock()
        record = replace(record, tried_at=started)
        self.submit_s = 0.0
        loop = WarmLoop(self.settings, self.store, self.submit)
        try:
            outcome = loop.warm_now(record.engine, PlanReason.REPLICA)
        except PrewarmError as exc:
            logger.warning("gate %s: warm-up failed: %s", record.engine, exc)
            return replace(record, tries=record.tries + 1, why=f"warm-up failed: {exc}")
        record = record.with_stage("planning", max(0.0, self.clock() - started - self.submit_s))
        if self.timings.warm is None:  # (sent to the workers: its run is read from the plan)
            record = record.with_stage("dispatch", self.submit_s)
        else:
            record = record.with_stage("dispatch", self.timings.dispatch)
            record = record.with_stage("warm", self.timings.warm)
        plan_id = outcome.get("plan_id")
        why = "" if plan_id else str(outcome.get("status") or "nothing to warm")
        return replace(record, plan_id=plan_id, tries=record.tries + 1, why=why)

    def _verify(self, record: GateRecord, engine: EngineSettings) -> GateRecord:
        """Admit the replica once its plan is done and every item it verified is held on it;
        a plan that failed is sent again at the next look. No plan (nothing seen to warm yet):
        admitted at once."""
        if record.plan_id is None:
            if record.why.startswith("warm-up failed"):
                return record
            return self._admit(engine, record, GateState.READY, record.why or "nothing to warm")
        plans, plan_id = PlanStore(self.store), record.plan_id
        try:
            report = plans.report(plan_id)
        except PrewarmError as exc:  # (expired, or never stored: sent again)
            return replace(record, plan_id=None, why=f"warm-up failed: {exc}")
        if report["state"] != "finished":
            return record
        if "warm" not in record.stages and "seconds" in report:
            record = record.with_stage("warm", float(report["seconds"]))
        started = self.clock()
        items = verified_items(plans, plan_id).get(engine.name, [])
        found = Holdings()
        check_replica(engine, self.store, items, found)
        record = record.with_stage("verification", self.clock() - started)
        if found.missing or report["items_failed"] or not items:
            why = "; ".join(found.why[:3]) or f"{report['items_failed']} items failed"
            return replace(record, plan_id=None, why=f"warm-up failed: not verified ({why})")
        return self._admit(engine, record, GateState.READY, f"{len(items)} items held")

    def _admit(
        self, engine: EngineSettings, record: GateRecord, state: GateState, why: str
    ) -> GateRecord:
        fleet = next(f for f in self.gated() if f.name == record.fleet)
        self._add(fleet, engine)
        if state == GateState.READY:
            problems.mark(self.store, problems.GATE_ADMITTED_COLD, engine.name, None, self.clock())
        return admitted(record, state, self.clock(), why)

    def _admit_cold(
        self, fleet: FleetSettings, engine: EngineSettings, record: GateRecord
    ) -> GateRecord:
        why = f"deadline of {fleet.gate_deadline_s:g}s passed, not verified: {record.why}"
        logger.warning("gate %s: admitted cold: %s", engine.name, why)
        problems.mark(self.store, problems.GATE_ADMITTED_COLD, engine.name, why, record.detected)
        return self._admit(engine, record, GateState.ADMITTED_COLD, why)

    # --- the router ---------------------------------------------------------------------------

    def _remove(self, fleet: FleetSettings, engine: EngineSettings) -> None:
        if fleet.gate_by == "router":
            self._edit(fleet, engine, "remove")

    def _add(self, fleet: FleetSettings, engine: EngineSettings) -> None:
        if fleet.gate_by == "router":
            self._edit(fleet, engine, "add")

    def _edit(self, fleet: FleetSettings, engine: EngineSettings, verb: str) -> None:
        try:
            with self.router_for(fleet) as router:
                if verb == "add":
                    router.add_worker(engine.url)
                else:
                    router.remove_worker(engine.url)
        except PrewarmError as exc:  # (the next episode's look tries again)
            logger.warning("gate %s: %s at the router failed: %s", engine.name, verb, exc)


def replica_readiness(
    settings: Settings, store: Store, replica: str, now: float
) -> tuple[int, dict[str, Any]]:
    """The readiness answer for ``replica`` (engine name or URL) of a gated fleet: 200 once the
    gate admitted it (or its deadline passed), 503 before, and for a replica it has not seen."""
    gated = [fleet for fleet in settings.fleets if fleet.gate]
    record = gate_state.find(store, [f.name for f in gated], replica)
    fleet = next((f for f in gated if record is not None and f.name == record.fleet), None)
    deadline = fleet.gate_deadline_s if fleet is not None else 0.0
    status, why = readiness(record, now, deadline) if fleet else readiness(None, now, 0.0)
    return status, {"replica": replica, "ready": status == 200, "why": why}


def gate_status(settings: Settings, store: Store, now: float) -> list[dict[str, Any]]:
    """Each gated replica's episode for ``prewarm status``."""
    out = []
    for fleet in settings.fleets:
        if not fleet.gate:
            continue
        for record in gate_state.fleet_records(store, fleet.name):
            row = record.to_dict()
            row["waiting_s"] = (
                round(now - record.detected, 3) if record.state == GateState.WAITING else None
            )
            row["time_to_ready_s"] = record.time_to_ready
            row["prewarm_s"] = round(record.prewarm_part(), 6)
            out.append(row)
    return out
