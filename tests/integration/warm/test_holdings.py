"""The post-plan check (``tasks.services.holdings``) on the engine SIMULATOR: items a batch
verified are checked again once the plan is done, at the engine's own URL — held, pushed out by
a later prime, or on a replica that stopped answering — and the plan's counts and the replica's
record say so."""

from __future__ import annotations

import time
from pathlib import Path

from jobs.simulator import SimulatorConfig, SimulatorServer
from pipeline.kv_holdings import chain_content_keys
from pipeline.planner.plan import WarmItem
from tasks.adapters import redis_keys, replica_holdings
from tasks.adapters.kv_state import KvStateStore
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.targets.base import WarmOptions
from tasks.services.batch_runner import BatchRunner
from tasks.services.holdings import check_plan_holdings
from tests.integration.warm.conftest import (
    MODEL,
    plan_of,
    prefix_item,
    settings_for,
    write_config,
)


def _warm(store, settings, items) -> str:
    plan = plan_of(items)
    PlanStore(store).save(plan, "sim", WarmOptions(batch_size=16))
    assert BatchRunner(store, settings).run(plan.plan_id, 0)["state"] == "committed"
    return plan.plan_id


def _engine(tmp_path: Path, capacity_blocks: int) -> SimulatorServer:
    config = SimulatorConfig(log_file=tmp_path / "sim.log", capacity_blocks=capacity_blocks)
    return SimulatorServer(config)  # (started by its with block)


def test_items_still_held_are_verified_and_recorded_on_the_replica(tmp_path, store):
    with _engine(tmp_path, 4096) as sim:
        settings = settings_for(write_config(tmp_path / "prewarm.toml", sim.url))
        items = [prefix_item(n, "held") for n in range(3)]
        plan_id = _warm(store, settings, items)
        record = check_plan_holdings(settings, store, plan_id)
    assert (record["held"], record["not_held"]) == (3, 0), record
    report = PlanStore(store).report(plan_id)
    assert (report["items_ok"], report["items_failed"]) == (3, 0)
    # (the store may also hold what a finish task of an earlier test found on its own "sim")
    held = {key.decode() for key in store.hkeys(redis_keys.REPLICA_HELD.format(engine="sim"))}
    assert {item.key for item in items} <= held, held
    assert replica_holdings.summary(store, "sim")["items"] >= 3
    # a second check of the same plan (a redelivered finish) changes no count
    check_plan_holdings(settings, store, plan_id)
    assert PlanStore(store).report(plan_id)["items_ok"] == 3


def test_an_item_pushed_out_by_a_later_prime_is_not_verified(tmp_path, store):
    # 8 blocks of 16 tokens: each prefix (about 100 tokens, 6 whole blocks) pushes out the last
    with _engine(tmp_path, 8) as sim:
        settings = settings_for(write_config(tmp_path / "prewarm.toml", sim.url))
        items = [prefix_item(n, "evicted") for n in range(3)]
        plan_id = _warm(store, settings, items)
        assert PlanStore(store).result(plan_id, 0)["ok"] == 3  # every prime counted as cached
        record = check_plan_holdings(settings, store, plan_id)
    assert record["not_held"] >= 2 and record["held"] <= 1, record
    assert any("tokens cached" in why for why in record["failures"]), record
    report = PlanStore(store).report(plan_id)
    assert report["items_ok"] == record["held"] and report["items_failed"] == record["not_held"]


def test_a_replica_that_stopped_answering_holds_nothing_and_is_not_waited_for(tmp_path, store):
    with _engine(tmp_path, 4096) as sim:
        settings = settings_for(write_config(tmp_path / "prewarm.toml", sim.url))
        plan_id = _warm(store, settings, [prefix_item(n, "gone") for n in range(4)])
    started = time.monotonic()
    record = check_plan_holdings(settings, store, plan_id)
    assert (record["held"], record["not_held"]) == (0, 4), record
    assert all("does not answer" in why for why in record["failures"]), record
    assert time.monotonic() - started < 10, "one unanswered probe, not one per item"


def test_an_item_the_engine_holds_that_its_events_miss_is_asked_of_the_engine(tmp_path, store):
    # what a restarted replica's follower can show: blocks the engine stored before the follower
    # saw the restart are not in its held set, and priming them again publishes nothing
    items = [
        WarmItem(
            "prefix",
            f"events-{n}",
            MODEL,
            text="",
            tokens=96,
            token_ids=tuple(range(n * 500 + 1, n * 500 + 97)),
        )
        for n in range(3)
    ]
    events = KvStateStore(store, "sim")
    events.heartbeat({"block_size": 16}, ttl_s=60)
    events.replace(chain_content_keys(items[0].token_ids or (), 16))  # the first item only
    try:
        with _engine(tmp_path, 4096) as sim:
            settings = settings_for(write_config(tmp_path / "prewarm.toml", sim.url))
            plan_id = _warm(store, settings, items)
            record = check_plan_holdings(settings, store, plan_id)
    finally:  # (no follower of "sim" is left for another test to trust)
        store.delete(*(f"{redis_keys.KV}sim:{part}" for part in ("held", "status", "alive")))
    assert (record["held"], record["not_held"]) == (3, 0), record
