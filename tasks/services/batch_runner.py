"""One batch of a plan as one WAL transaction: claim, begin, apply, verify, commit or roll back.

Idempotent by (plan, batch): a finished batch's result is stored in the same ``MULTI`` as its
commit, so a redelivered message finds it and does nothing. A batch whose previous attempt died
(its claim and lease expired) has that attempt rolled back first. While a batch runs, a keeper
thread renews its WAL lease, its claim and its engine-semaphore slot; a SIGKILL stops the
renewals, the lease expires and the recovery sweep rolls the transaction back.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pipeline.errors import PrewarmError, TransientError
from pipeline.fleet_roads import Road, road_of
from pipeline.planner.plan import WarmItem
from pipeline.router_kinds import router_kind
from pipeline.wal import FINAL_STATES, Effect, TxnState
from tasks.adapters import fleet_state
from tasks.adapters.cooldowns import release_cooldowns
from tasks.adapters.engine_client import EngineClient, RetryPolicy
from tasks.adapters.engine_semaphore import EngineSemaphore
from tasks.adapters.gateway_client import GatewayClient, GatewayLog
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.router_client import RouterClient
from tasks.adapters.sources import gateway_log_files
from tasks.adapters.store import Store, StoreError
from tasks.adapters.targets import adapter as adapter_target
from tasks.adapters.targets import apply_items, undo_for, verify_items
from tasks.adapters.targets.base import BatchContext, ItemResult, RoutedFleet, WarmOptions
from tasks.adapters.telemetry import defer_batch, plan_labels, record_wal
from tasks.adapters.wal_store import LeaseLost, WalStore
from tasks.services.event_verification import confirmed_by_events
from tasks.settings import EngineSettings, Settings

#: the semaphore name of a fleet's road through its router (one batch at a time per fleet)
ROUTED_SLOT = "fleet-router:"


class BatchBusy(TransientError):
    """Another worker holds this batch (or its dead attempt's lease has not expired yet)."""


def engine_client(
    engine: EngineSettings, options: WarmOptions, router_url: str | None = None
) -> EngineClient:
    """A client for ``engine`` with the plan's timeout and retry policy; with ``router_url``, at
    its fleet's router, sending requests exactly as users do (no header of prewarm's)."""
    retry = RetryPolicy(attempts=options.retry_attempts, base_s=options.retry_base_s)
    return EngineClient(engine, timeout_s=options.timeout_s, retry=retry, base_url=router_url,
                        request_ids=router_url is None)  # fmt: skip


class _Keeper(threading.Thread):
    """Renews the claim, the semaphore slot and the lease every third of the lease."""

    def __init__(self, renewals: list[Callable[[], object]], period_s: float) -> None:
        super().__init__(daemon=True, name="prewarm-lease")
        self.renewals, self.period_s = renewals, period_s
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.period_s):
            for renew in list(self.renewals):
                # A failed renewal is retried next period; an expired lease is the sweep's job.
                with contextlib.suppress(StoreError):
                    renew()


@contextmanager
def _kept_alive(renewals: list[Callable[[], object]], period_s: float) -> Iterator[None]:
    keeper = _Keeper(renewals, period_s)
    keeper.start()
    try:
        yield
    finally:
        keeper.stopped.set()
        keeper.join(timeout=5)


@dataclass(frozen=True)
class _BatchEnd:
    """What a batch writes as it ends: its result (what a redelivery finds), queued on its
    commit's ``MULTI``, and, once that commit holds, its metrics (:func:`defer_batch`)."""

    plans: PlanStore
    plan_id: str
    items: Sequence[WarmItem]
    labels: tuple[str, str]

    def queue(self, pipe: Any, summary: dict[str, Any]) -> None:
        self.plans.record_result(pipe, self.plan_id, summary)

    def count(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Count the ended batch; returns ``summary``."""
        defer_batch(self.plans.r, self.labels, self.plan_id, self.items, summary)
        return summary


def _chunks(items: Sequence[WarmItem], size: int) -> list[Sequence[WarmItem]]:
    step = size if size > 0 else max(1, len(items))
    return [items[i : i + step] for i in range(0, len(items), step)]


def _summary(
    plan_id: str,
    batch: int,
    ctx: BatchContext,
    state: str,
    results: Sequence[ItemResult],
    started: float,
) -> dict[str, Any]:
    failed = [r for r in results if not r.ok]
    return {
        "plan": plan_id,
        "batch": batch,
        "txn": ctx.txn_id,
        "state": state,
        "items": len(results),
        "ok": len(results) - len(failed),
        "failed": len(failed),
        "failures": [f"{r.key}: {r.detail}" for r in failed[:5]],
        "verified_by_prime": sum(1 for r in results if r.ok and r.verified_by == "prime"),
        "replicas": _landed(results),
        "held_on": _held_on(results, ctx.engine.engine.name),
        "seconds": round(time.perf_counter() - started, 4),
        "pid": os.getpid(),
        "engine_requests": ctx.engine.requests - ctx.requests_at_start,
    }


def _held_on(results: Sequence[ItemResult], engine: str) -> dict[str, str]:
    """Each verified prefix and the replica it is held on: where a prime through the router
    landed, else the batch's own engine (checked there once the plan is done)."""
    return {r.key: r.replica or engine for r in results if r.ok and r.kind == "prefix"}


def _landed(results: Sequence[ItemResult]) -> dict[str, dict[str, int]]:
    """Per fleet replica, the items primed through the router that landed and verified there,
    and their prompt tokens (empty for a batch sent to its engine directly)."""
    landed: dict[str, dict[str, int]] = {}
    for r in results:
        if r.ok and r.replica:
            row = landed.setdefault(r.replica, {"items": 0, "tokens": 0})
            row["items"] += 1
            row["tokens"] += r.prime.prompt_tokens if r.prime is not None else 0
    return landed


class BatchRunner:
    """Runs batches against prewarm's store with the configured engines."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self.plans = PlanStore(store)
        self.wal = WalStore(store, settings.wal_lease_s)
        self._clients: dict[tuple[str, float, int, float, str], EngineClient] = {}
        self._gateways: dict[str, GatewayClient] = {}

    def client(
        self, engine: EngineSettings, options: WarmOptions, router_url: str | None = None
    ) -> EngineClient:
        key = (engine.name, options.timeout_s, options.retry_attempts, options.retry_base_s,
               router_url or "")  # fmt: skip
        if key not in self._clients:
            self._clients[key] = engine_client(engine, options, router_url)
        return self._clients[key]

    def gateways(self, engine: EngineSettings) -> dict[str, GatewayClient]:
        """Clients of the gateways in front of ``engine``, built once per runner."""
        for gateway in self.settings.gateways_of(engine.name):
            if gateway.name not in self._gateways:
                self._gateways[gateway.name] = GatewayClient(gateway)
        return {g.name: self._gateways[g.name] for g in self.settings.gateways_of(engine.name)}

    def undo(self, engine: EngineSettings, options: WarmOptions) -> Any:
        """The compensating calls for ``engine``'s effects and its gateways'."""
        return undo_for(self.client(engine, options), self.gateways(engine))

    def routed(self, engine: EngineSettings, options: WarmOptions) -> RoutedFleet | None:
        """The road through the router for a replica of a fleet whose router remembers what it
        routed (its prefixes go through the router), or whose plan says so (``options.road``:
        after its router restarted); None for any other engine."""
        if engine.fleet is None:
            return None
        fleet = self.settings.fleet(engine.fleet)
        road = Road(options.road) if options.road else road_of(fleet.policy)
        if road is not Road.THROUGH_ROUTER:
            return None
        replicas = {e.name: self.client(e, options) for e in self.settings.replicas_of(fleet.name)}
        text_keyed = fleet.policy in router_kind(fleet.router).text_keyed
        # (a road named on the plan is the one taken after the router restarted)
        spread = options.road == Road.THROUGH_ROUTER.value
        router = self.client(engine, options, fleet.router_url)
        return RoutedFleet(router, replicas, text_keyed=text_keyed, spread=spread)

    def semaphore(self, engine: EngineSettings, routed: bool) -> EngineSemaphore:
        """The slot a batch of ``engine`` holds while it runs: one of the engine's own
        (``max_concurrency``), or, for a batch sent through its fleet's router, the fleet's one
        slot. A prime through the router is placed by the one replica whose lookups grew; two
        batches through one router at once (a replica's restore and a router restart's warm-up)
        made every prime of both ambiguous, and failed them as unplaced."""
        if routed:
            name, limit = f"{ROUTED_SLOT}{engine.fleet}", 1
        else:
            name, limit = engine.name, engine.max_concurrency
        return EngineSemaphore(self.store, name, limit, hold_s=self.settings.wal_lease_s)

    def run(self, plan_id: str, batch: int) -> dict[str, Any]:
        """Run batch ``batch`` of ``plan_id`` once; a finished batch returns its stored result."""
        done = self.plans.result(plan_id, batch)
        if done is not None:
            return {**done, "duplicate": True}
        items, options, engine_name = self.plans.load_batch(plan_id, batch)
        engine = self.settings.engine(engine_name)
        owner = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        end = _BatchEnd(self.plans, plan_id, items, plan_labels(self.store, plan_id, engine.name))
        self._claim(plan_id, batch, owner)
        try:
            return self._run_claimed(end, batch, engine, options, owner)
        finally:
            self.plans.release(plan_id, batch, owner)

    def _claim(self, plan_id: str, batch: int, owner: str) -> None:
        if not self.plans.claim(plan_id, batch, owner, self.settings.wal_lease_s):
            raise BatchBusy(f"plan {plan_id} batch {batch} is being run by another worker")
        previous = self.plans.txn(plan_id, batch)
        if previous and self.wal.state(previous) not in (None, *FINAL_STATES):
            self._recover_previous(plan_id, batch, previous, owner)

    def _recover_previous(self, plan_id: str, batch: int, txn_id: str, owner: str) -> None:
        if not self.wal.take_over(txn_id, owner):
            self.plans.release(plan_id, batch, owner)
            raise BatchBusy(f"plan {plan_id} batch {batch}: previous attempt still holds its lease")
        engine = self.settings.engine(self.wal.engine_of(txn_id))
        self.wal.rollback(txn_id, owner, self.undo(engine, WarmOptions()))
        record_wal(self.store, engine.name, "recovered")

    def _run_claimed(
        self, end: _BatchEnd, batch: int, engine: EngineSettings, options: WarmOptions, owner: str
    ) -> dict[str, Any]:
        started = time.perf_counter()
        plan_id = end.plan_id
        client = self.client(engine, options)
        routed = self.routed(engine, options)
        semaphore = self.semaphore(engine, routed is not None)
        logs = GatewayLog(gateway_log_files(self.settings, engine.name))
        gateways = self.gateways(engine)
        ctx = BatchContext(
            self.store, client, options, gateways=gateways,
            adapter_paths=adapter_target.adapter_paths(engine.adapters),
            gateway_logs=dict.fromkeys(gateways, logs), routed=routed,
        )  # fmt: skip
        self.plans.count_run(plan_id, batch)
        ctx.requests_at_start = client.requests
        lease = self.settings.wal_lease_s
        # The claim is kept alive from the start (waiting for a slot may outlast a lease);
        # the slot and the transaction join the renewals once they exist.
        renewals: list[Callable[[], object]] = [
            lambda: self.plans.renew_claim(plan_id, batch, lease)
        ]
        with (
            _kept_alive(renewals, period_s=lease / 3),
            semaphore.slot(wait_s=max(60.0, lease), holder=owner),
        ):
            renewals.append(lambda: semaphore.renew(owner))
            txn = self.wal.begin(
                plan_id, batch, engine.name, owner,
                extra=lambda pipe, txn_id: self.plans.set_txn(plan_id, batch, txn_id, pipe),
            )  # fmt: skip
            ctx.wal, ctx.txn_id, ctx.owner = self.wal, txn.txn_id, owner
            renewals.append(lambda: self.wal.renew(txn.txn_id, owner))
            summary = self._transaction(end, batch, ctx, started)
        if routed is not None and summary["state"] != "committed":
            self._road_failed(engine, plan_id)
        return summary

    def _road_failed(self, engine: EngineSettings, plan_id: str) -> None:
        """A batch through ``engine``'s fleet's router failed: if the router does not answer,
        the replica is owed a warm-up once it does (the replica watch sends it), and the
        failed warm-up frees the cooldown it took."""
        fleet = self.settings.fleet(engine.fleet or "")
        with RouterClient(fleet) as router:
            if router.is_up():
                return
        fleet_state.remember_road_failed(self.store, fleet.name, engine.name, plan_id, time.time())
        release_cooldowns(self.store, engine.name)

    def _transaction(
        self, end: _BatchEnd, batch: int, ctx: BatchContext, started: float
    ) -> dict[str, Any]:
        wal, txn_id, owner, items = self.wal, ctx.txn_id, ctx.owner, end.items
        results: list[ItemResult] = []
        undo = undo_for(ctx.engine, ctx.gateways)
        try:
            wal.move(txn_id, owner, TxnState.APPLYING)
            for chunk in _chunks(items, ctx.options.apply_chunk):
                results.extend(apply_items(chunk, ctx))
            wal.move(txn_id, owner, TxnState.VERIFYING)
            if ctx.options.verify:
                verify_items(*confirmed_by_events(items, results, ctx), ctx)
        except LeaseLost:
            raise
        except PrewarmError as exc:
            results = results or [ItemResult(i.key, i.kind, False, str(exc)) for i in items]
            return self._roll_back(end, batch, results, ctx, started, undo)
        failed = sum(1 for r in results if not r.ok)
        if results and failed / len(results) > ctx.options.max_failure_ratio:
            return self._roll_back(end, batch, results, ctx, started, undo)
        summary = _summary(end.plan_id, batch, ctx, "committed", results, started)
        restore = [r.redis_key for r in results if not r.ok and r.redis_key]
        wal.finish(
            txn_id, owner, TxnState.COMMITTED, restore, extra=lambda pipe: end.queue(pipe, summary)
        )
        return end.count(summary)

    def _roll_back(
        self,
        end: _BatchEnd,
        batch: int,
        results: Sequence[ItemResult],
        ctx: BatchContext,
        started: float,
        undo: Any,
    ) -> dict[str, Any]:
        summary = _summary(end.plan_id, batch, ctx, "rolled_back", results, started)
        try:
            self.wal.rollback(
                ctx.txn_id, ctx.owner, undo, extra=lambda pipe: end.queue(pipe, summary)
            )
        except PrewarmError as exc:
            # An undo step failed (engine down): the lease runs out and the sweep finishes it.
            # No result is stored (a redelivery runs the batch again); its metrics still count.
            summary.update(state="rollback_pending", error=str(exc))
        return end.count(summary)

    def sweep(self, now: float | None = None) -> list[str]:
        """Roll back every transaction whose lease expired by ``now`` (default: the WAL's
        clock) — the recovery sweep."""

        def undo_for(engine_name: str) -> Any:
            # Resolved on first use: a transaction with nothing to undo on its engine rolls
            # back even when that engine has left the configuration since.
            def undo(effect: Effect) -> None:
                engine = self.settings.engine(engine_name)
                self.undo(engine, WarmOptions())(effect)

            return undo

        return self.wal.sweep(undo_for, now)
