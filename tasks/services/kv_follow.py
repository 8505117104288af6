"""The KV-event source of one engine: follow its stream, restore it after a restart, verify.

Entry points::

    follow(source, settings, store, *, submit, stop=None, restore=True) -> FollowReport
        The long-running service (``prewarm kv-events``): subscribe, apply batches to the
        replica's holdings, mirror the held set in Redis, write closed windows' counts and a
        snapshot to data_dir, and — when the replica lost its cache (the stream restarted, the
        engine's process start time changed, or ``AllBlocksCleared``) — restore it.

    restore_plan(settings, engine, holdings) -> WarmPlan
        Candidates from what the replica held (:func:`pipeline.kv_holdings.restore_candidates`)
        as the ``extra`` of the one planning service (:func:`tasks.services.planning.plan_for`,
        reason ``replica``, so ``/metrics`` counts it as ``reason="replica"``).

    restore_replica(settings, engine, submit, holdings=None) -> str | None
        ``restore_plan`` handed to ``submit`` (production: :func:`tasks.warm_tasks.submitter`,
        ordered: the cache is an LRU); holdings default to the engine's snapshot in data_dir.
        Returns the plan id.

Verification by the replica's events is :mod:`tasks.services.event_verification`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace

from pipeline.kv_holdings import ReplicaHoldings, restore_candidates
from pipeline.planner.plan import WarmPlan
from pipeline.planner.reasons import PlanReason
from pipeline.records import records_frame
from tasks.adapters.engine_probe import observe
from tasks.adapters.kv_state import KvStateStore, append_counts, load_holdings, save_holdings
from tasks.adapters.kv_subscriber import KvSubscriber
from tasks.adapters.store import Store
from tasks.services import planning
from tasks.services.loop import Submit
from tasks.services.planning import plan_request
from tasks.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KvSource:
    """One engine's KV-event stream (``[[sources]] kind = "kv-events"``)."""

    engine: str
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""


@dataclass
class FollowReport:
    """What a :func:`follow` run did."""

    batches: int = 0
    resets: int = 0
    restores: list[str] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)


def restore_plan(settings: Settings, engine: str, holdings: ReplicaHoldings) -> WarmPlan:
    """The plan that re-primes what ``engine`` held, hottest chains within its capacity: the
    one planning service, reason ``replica``, with the held chains as its ``extra``."""
    request = plan_request(settings, engine)
    model = settings.engine(engine).model
    items = restore_candidates(holdings, model, min_uses=request.min_count)
    plan = planning.plan_for(
        records_frame([]), request, reason=PlanReason.REPLICA, forecast="frequency", extra=items
    )
    notes = ("restore from KV-cache events", f"held before: {len(items)} chains")
    return replace(plan, notes=(*plan.notes, *notes))


def restore_replica(
    settings: Settings,
    engine: str,
    submit: Submit,
    holdings: ReplicaHoldings | None = None,
) -> str | None:
    """Submit :func:`restore_plan` through ``submit``; None when there is nothing to restore."""
    if holdings is None:
        loaded = load_holdings(settings.data_dir, engine)
        if loaded is None:
            return None
        holdings = loaded[0]
    plan = restore_plan(settings, engine, holdings)
    if not plan.items:
        return None
    return submit(plan, engine)


def _configured(settings: Settings, engine: str) -> bool:
    return any(e.name == engine for e in settings.engines)


def _engine_state(settings: Settings, engine: str) -> tuple[bool, float | None]:
    """Whether the engine answers, and its process start time from ``/metrics`` (None when it
    does not say or is not configured: then only the stream tells a restart)."""
    if not _configured(settings, engine):
        return False, None
    observation, _ = observe(settings.engine(engine), timeout_s=2.0)
    return observation.healthy, observation.start_time if observation.healthy else None


@dataclass
class _Follower:
    source: KvSource
    settings: Settings
    state: KvStateStore
    holdings: ReplicaHoldings
    subscriber: KvSubscriber
    restore: bool
    submit: Submit
    report: FollowReport = field(default_factory=FollowReport)
    started_at: float | None = None
    restore_pending: bool = False
    saved: tuple[int, int] = (-1, -1)

    def step(self, timeout_s: float) -> None:
        for chunk in self.subscriber.receive(timeout_s):
            if chunk.restarted:
                self.lost_cache()
            for message in chunk.messages:
                resets = self.holdings.resets
                self.holdings.apply(message.batch)
                self.report.batches += 1
                if self.holdings.resets != resets and self.holdings.lost_at_reset:
                    self.after_reset()
        self.state.apply(*self.holdings.take_changes())

    def lost_cache(self) -> None:
        """The replica came back empty: reset what it holds and restore what it held."""
        self.holdings.reset()
        if self.holdings.lost_at_reset:
            self.after_reset()

    def after_reset(self) -> None:
        """Restore once the engine answers again (it may still be loading its model)."""
        self.report.resets += 1
        self.state.apply(*self.holdings.take_changes())
        if not self.restore or not self.holdings.before_reset:
            return
        if not _configured(self.settings, self.source.engine):
            log.warning("engine %s is not configured: nothing restored", self.source.engine)
            return
        self.restore_pending = True
        self.probe()

    def submit_restore(self) -> None:
        self.restore_pending = False
        plan_id = restore_replica(self.settings, self.source.engine, self.submit, self.holdings)
        if plan_id:
            self.report.restores.append(plan_id)
            self.state.heartbeat({"last_restore": plan_id, "restores": len(self.report.restores)})
            log.info("engine %s: restore plan %s submitted", self.source.engine, plan_id)

    def probe(self) -> None:
        """Is the engine up (then a pending restore goes), and did it restart (a new process
        start time: a restart the stream may not show yet)?"""
        up, started = _engine_state(self.settings, self.source.engine)
        if started is not None:
            previous, self.started_at = self.started_at, started
            if previous is not None and started != previous:
                self.lost_cache()
        if up and self.restore_pending:
            self.submit_restore()

    def persist(self, window_closed_before: float | None) -> None:
        """Heartbeat and closed windows' counts; the snapshot only when something changed (it
        holds every known block's tokens: ~1 KiB a block)."""
        version = (self.report.batches, self.holdings.resets)
        if version != self.saved or window_closed_before is None:
            save_holdings(self.settings.data_dir, self.holdings, self.subscriber.cursor)
            self.saved = version
        counts = self.holdings.take_counts(window_closed_before)
        append_counts(self.settings.data_dir, self.source.engine, counts)
        cursor = self.subscriber.cursor
        status = {**self.subscriber.counters.as_dict(), "batches": self.report.batches,
                  "held": len(self.holdings.held), "resets": self.holdings.resets,
                  "form": self.subscriber.decoder.form, "block_size": self.holdings.block_size,
                  "last_seq": cursor.seq if cursor else None}  # fmt: skip
        self.state.heartbeat(status)


def follow(
    source: KvSource,
    settings: Settings,
    store: Store,
    *,
    submit: Submit,
    stop: threading.Event | None = None,
    restore: bool = True,
    probe_s: float = 5.0,
    persist_s: float = 1.0,
) -> FollowReport:
    """Follow ``source`` until ``stop`` is set (see the module docstring)."""
    stop = stop or threading.Event()
    loaded = load_holdings(settings.data_dir, source.engine)
    holdings, cursor = loaded or (ReplicaHoldings(source.engine, settings.schedule.window_s), None)
    subscriber = KvSubscriber(
        source.endpoint, source.replay_endpoint, topic=source.topic, cursor=cursor
    )
    state = KvStateStore(store, source.engine)
    state.replace(holdings.held_contents())
    follower = _Follower(source, settings, state, holdings, subscriber, restore, submit)
    follower.probe()
    next_probe = next_persist = time.monotonic()
    try:
        while not stop.is_set():
            follower.step(timeout_s=0.2)
            now = time.monotonic()
            if now >= next_persist:
                follower.persist(window_closed_before=time.time())
                next_persist = now + persist_s
            if now >= next_probe:
                follower.probe()
                # waiting to restore: ask again soon, the engine is coming back
                next_probe = now + (1.0 if follower.restore_pending else probe_s)
        follower.persist(window_closed_before=None)
    finally:
        subscriber.close()
    follower.report.counters = subscriber.counters.as_dict()
    return follower.report
