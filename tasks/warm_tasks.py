"""Warm-up execution: submit a plan, fan its batches out, report progress, recover.

The entry points other parts call::

    submit_plan(plan: WarmPlan, engine_name: str | None = None, *,
                options: WarmOptions | None = None, settings: Settings | None = None,
                queue: str | None = None) -> str
        Store the plan in Redis and send its batches as a Celery chord (``options.ordered``:
        a chain, batch after batch, so an engine's LRU ends with the plan's last items; the
        default options order plans that have a token budget).
        Returns the plan id. ``engine_name`` defaults to ``plan.engine``; it must be configured.

    plan_report(plan_id: str, *, settings: Settings | None = None) -> dict
        {plan_id, engine, state, batches, items, batches_done, committed, rolled_back,
         items_ok, items_failed, done, [seconds]}

    wait_plan(plan_id: str, timeout_s: float = 300.0, *, settings: Settings | None = None,
              poll_s: float = 0.2) -> dict
        Poll ``plan_report`` until every batch is done; a timeout is a TransientError.

    batch_results(plan_id: str, *, settings: Settings | None = None) -> list[dict]
    recover(*, settings: Settings | None = None) -> list[str]   # the WAL sweep, in-process
    recover_and_resume(*, settings=None, now=None) -> {"rolled_back": [...], "resumed": [...]}
        The whole recovery sweep: roll back expired transactions, then re-queue every plan
        that stalled because a worker died under it (``tasks.services.recovery``).

Tasks (queue ``warm``): ``prewarm.warm.batch(plan_id, batch)``, ``prewarm.warm.finish``
(chord callback), ``prewarm.warm.recover`` (the sweep; put it on beat every
``schedule.wal_sweep_s``).

A plan waits at most one WAL lease (``wal_lease_s``) plus one sweep period
(``schedule.wal_sweep_s``) after its worker died before it runs again: the lease is renewed
every third of itself while a batch runs, so a plan with no sign of life for one lease has lost
its worker, and the next sweep re-queues it. The broker's visibility timeout is only the
fallback redelivery of the lost message (harmless: batches are idempotent); it is chosen long
(``visibility_timeout_s``, 900 s, at least 10 leases) so that a live task, or a retry waiting
its countdown of three leases, is never delivered twice.
"""

from __future__ import annotations

import logging
import time
from functools import lru_cache
from typing import Any

from celery import chain, chord, shared_task

from pipeline.errors import PrewarmError, TransientError
from pipeline.planner.plan import WarmPlan
from pipeline.planner.reasons import PlanReason
from tasks.adapters.broker_queues import waiting_messages
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.store import STORE_DOWN, broker_client, store_client
from tasks.adapters.targets.base import WarmOptions
from tasks.adapters.telemetry import record_plan
from tasks.adapters.wal_store import LeaseLost, WalStore
from tasks.base import PrewarmTask
from tasks.celery_app import ROUTINE_PRIORITY, URGENT_PRIORITY, app
from tasks.services.batch_runner import BatchRunner
from tasks.services.fleets import fleet_settings
from tasks.services.holdings import check_plan_holdings
from tasks.services.loop import Submit
from tasks.services.recovery import PlanResumer
from tasks.settings import Settings, current_settings

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def _runner_for(settings: Settings) -> BatchRunner:
    return BatchRunner(store_client(settings), settings)


def _runner() -> BatchRunner:
    # Built once per process and settings: a changed settings file (a new engine) or a replica a
    # fleet's router added gets a new one.
    settings = current_settings()
    return _runner_for(fleet_settings(settings, store_client(settings)))


def _plans(settings: Settings | None) -> PlanStore:
    settings = settings or current_settings()
    return PlanStore(store_client(settings))


def submit_plan(
    plan: WarmPlan,
    engine_name: str | None = None,
    *,
    options: WarmOptions | None = None,
    settings: Settings | None = None,
    queue: str | None = None,
) -> str:
    """Store ``plan`` and send its batches to the workers; returns the plan id.

    ``queue`` overrides the ``warm`` queue (a dedicated pool of warm-up workers).
    """
    settings = settings or fleet_settings(current_settings(), store_client(current_settings()))
    engine = settings.engine(engine_name or plan.engine).name
    # A plan cut to the cache's capacity runs batch after batch: its order is its LRU order.
    ordered = plan.budget.max_tokens is not None
    options = options or WarmOptions(
        batch_size=plan.budget.batch_size, ordered=ordered, road=plan.road
    )
    batches = _plans(settings).save(plan, engine, options, queue)
    record_plan(store_client(settings), plan, engine)
    # a window's routine warm-up yields to one a trigger or a person asked for
    routine = plan.reason == PlanReason.WINDOW
    priority = ROUTINE_PRIORITY if routine else URGENT_PRIORITY
    dispatch(plan.plan_id, list(range(batches)), options.ordered, queue, priority)
    return plan.plan_id


def submitter(settings: Settings, queue: str | None = None) -> Submit:
    """The loop's and the restore's submitter: :func:`submit_plan` with ``settings`` (and
    ``queue``)."""

    def submit(plan: WarmPlan, engine: str) -> str:
        return submit_plan(plan, engine, settings=settings, queue=queue)

    return submit


def dispatch(
    plan_id: str,
    batches: list[int],
    ordered: bool,
    queue: str | None,
    priority: int = ROUTINE_PRIORITY,
) -> None:
    """Send ``batches`` of a stored plan, then its finish task, with ``priority``: ordered, as
    a chain (batch after batch); else as a chord. Used at submission and when the sweep
    resumes a plan."""
    route: dict[str, Any] = {"priority": priority} | ({"queue": queue} if queue else {})
    sigs = [app.signature("prewarm.warm.batch", (plan_id, n), immutable=True, **route)
            for n in batches]  # fmt: skip
    finish = app.signature("prewarm.warm.finish", (plan_id,), immutable=True, **route)
    if not sigs:
        finish.apply_async()
    elif ordered:
        chain(*sigs, finish).apply_async()
    else:
        chord(sigs)(finish)


def plan_report(plan_id: str, *, settings: Settings | None = None) -> dict[str, Any]:
    """Progress of a submitted plan."""
    return _plans(settings).report(plan_id)


def batch_results(plan_id: str, *, settings: Settings | None = None) -> list[dict[str, Any]]:
    """Per-batch results of a plan (finished batches only)."""
    return _plans(settings).results(plan_id)


def wait_plan(
    plan_id: str,
    timeout_s: float = 300.0,
    *,
    settings: Settings | None = None,
    poll_s: float = 0.2,
) -> dict[str, Any]:
    """Block until every batch of ``plan_id`` is finished; returns the report."""
    deadline = time.monotonic() + timeout_s
    while True:
        report = plan_report(plan_id, settings=settings)
        if report["done"]:
            return report
        if time.monotonic() > deadline:
            raise TransientError(f"plan {plan_id}: not done after {timeout_s:.0f}s ({report})")
        time.sleep(poll_s)


def recover(*, settings: Settings | None = None) -> list[str]:
    """Run the WAL recovery sweep in this process; returns the rolled-back transaction ids."""
    settings = settings or current_settings()
    return BatchRunner(store_client(settings), settings).sweep()


def resumer(settings: Settings) -> PlanResumer:
    """The sweep's second half: plans stalled for one WAL lease are re-queued."""
    store = store_client(settings)
    broker = broker_client(settings)
    return PlanResumer(
        PlanStore(store),
        WalStore(store, settings.wal_lease_s),
        dispatch,
        waiting=lambda queue: waiting_messages(broker, [queue])[queue],
        stall_s=settings.wal_lease_s,
    )


def recover_and_resume(
    *, settings: Settings | None = None, now: float | None = None
) -> dict[str, list[Any]]:
    """The recovery sweep: roll back expired transactions, then resume the plans they (or a
    lost message) stalled. Returns ``{"rolled_back": [txn ids], "resumed": [{plan, …}]}``."""
    settings = settings or current_settings()
    rolled_back = recover(settings=settings)
    resumed = resumer(settings).resume_stalled(time.time() if now is None else now)
    for row in resumed:
        log.warning(
            "plan %s resumed from batch %s after its worker died", row["plan"], row["from_batch"]
        )
    return {"rolled_back": rolled_back, "resumed": resumed}


def wal_status(*, settings: Settings | None = None) -> dict[str, Any]:
    """Open transactions and their leases."""
    settings = settings or current_settings()
    return WalStore(store_client(settings), settings.wal_lease_s).summary()


#: A batch that failed on one of these runs again after three leases.
_RETRIED: tuple[type[Exception], ...] = (TransientError, LeaseLost, *STORE_DOWN)


@shared_task(name="prewarm.warm.batch", bind=True, base=PrewarmTask, max_retries=20)
def run_batch(self: Any, plan_id: str, batch: int) -> dict[str, Any]:
    """Run one batch of a stored plan as one WAL transaction; idempotent by (plan, batch)."""
    try:
        return _runner().run(plan_id, batch)
    except _RETRIED as exc:
        # Long enough for a dead attempt's lease to run out and the sweep to roll it back.
        raise self.retry(exc=exc, countdown=3 * current_settings().wal_lease_s) from exc


@shared_task(name="prewarm.warm.finish", base=PrewarmTask)
def finish_plan(plan_id: str) -> dict[str, Any]:
    """Chord callback: check that every item verified is still held on its users' replica
    (:func:`tasks.services.holdings.check_plan_holdings`), mark the plan finished and return
    its report."""
    runner = _runner()
    settings = fleet_settings(runner.settings, runner.store)
    try:
        check_plan_holdings(settings, runner.store, plan_id)
    except PrewarmError as exc:  # (the plan still finishes; its items stay as batches said)
        log.warning("plan %s: holdings not checked: %s", plan_id, exc)
    runner.plans.mark_finished(plan_id)
    return runner.plans.report(plan_id)


@shared_task(name="prewarm.warm.recover", base=PrewarmTask, periodic=True)
def recover_task() -> dict[str, Any]:
    """The recovery sweep: roll back transactions whose lease expired, resume stalled plans."""
    return recover_and_resume()
