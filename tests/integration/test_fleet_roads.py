"""Warm-ups by router family on simulator replicas behind the real ``vllm-router``: a text-history
router (``cache_aware``) is warmed through the router, one prompt per request as users send it,
each prime verified on the replica it landed on (read at the replica's own ``/metrics``); a
spread one (``round_robin``) on every replica from the records of all of them."""

from __future__ import annotations

import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.fleet_roads import ROUTER_RESTARTED, road_note, through_router
from pipeline.planner.plan import WarmPlan
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.targets.base import WarmOptions
from tasks.services.batch_runner import BatchRunner
from tasks.services.fleets import router_restart_warms
from tasks.settings import Settings
from tasks.settings.fleets import FleetSettings, ReplicaSettings
from tests.integration.fleet_rig import FleetRig

pytestmark = pytest.mark.integration

TEMPLATES = 4


@pytest.fixture
def rig(request, tmp_path, store, store_url):
    fleet = FleetRig(tmp_path, request.param, 3, store, store_url).start()
    yield fleet
    fleet.stop()


@pytest.mark.parametrize("rig", ["cache_aware"], indirect=True)
def test_cache_aware_is_warmed_through_the_router_after_a_rolling_restart(rig):
    rig.traffic(TEMPLATES, uses=3)
    rig.observe()
    rig.rolling_restart()
    assert rig.warmups.batches, "no warm-up ran"
    assert all(road_note("cache_aware") in " ".join(b["notes"]) for b in rig.warmups.batches)
    assert all(b["state"] == "committed" for b in rig.warmups.batches), rig.warmups.batches
    first = rig.first_uses(TEMPLATES, "the rolling restart")
    assert sum(hit for hit, _ in first.values()) == TEMPLATES, first
    landed = {replica for _, replica in first.values()}
    assert landed <= set(rig.warmups.requests), (landed, rig.warmups.requests)
    # the warm-ups went through the router, without prewarm's request id, one per request; the
    # requests with prewarm's id are the post-plan checks, one per item, at the replica's URL
    logs = "".join(p.read_text() for p in rig.tmp.glob("replica-*.log"))
    own = [rid for rid in re.findall(r"Received request (\S+)", logs) if "prewarm-" in rid]
    plans = PlanStore(rig.store)
    checks = [plans.report(p)["holdings"] for p in {b["plan"] for b in rig.warmups.batches}]
    assert len(own) == sum(c["held"] + c["not_held"] for c in checks) > 0, (own, checks)
    assert all(c["not_held"] == 0 for c in checks), checks
    assert '"prompt":["' not in logs
    # a router restart alone: its memory is gone, so every replica is warmed through it again
    rig.router.restart()
    fired = rig.poll()
    assert sorted(f["kind"] for f in fired) == ["router_restarted"] * 3, fired
    first = rig.first_uses(TEMPLATES, "the router's restart")
    assert sum(hit for hit, _ in first.values()) == TEMPLATES, first


@pytest.mark.parametrize("rig", ["round_robin"], indirect=True)
def test_spread_placement_is_warmed_on_every_replica_within_capacity(rig):
    rig.traffic(TEMPLATES, uses=2)
    rig.observe()
    rig.rolling_restart()
    notes = " ".join(n for b in rig.warmups.batches for n in b["notes"])
    assert "candidates: the records of all 3 replicas" in notes
    assert len(rig.warmups.requests) == 3  # every replica warmed directly
    first = rig.first_uses(TEMPLATES, "the rolling restart")
    assert sum(hit for hit, _ in first.values()) == TEMPLATES, first
    assert all(held <= 512 * 16 for held in rig.held_tokens().values())


def test_batches_through_one_router_take_turns(store, store_url, tmp_path):
    """Two replicas' batches through one router run one at a time (each prime is placed by the
    one replica whose lookups grew); a batch sent to a replica directly keeps its own slots."""
    replicas = tuple(ReplicaSettings(url=f"http://127.0.0.1:{port}") for port in (8001, 8002))
    fleets = tuple(
        FleetSettings(name=policy, router_url="http://127.0.0.1:8000", policy=policy,
                      model="m", replicas=replicas, max_concurrency=2)
        for policy in ("cache_aware", "kv_aware")
    )  # fmt: skip
    settings = Settings(redis_url=store_url, store_url=store_url, data_dir=tmp_path, fleets=fleets)
    runner = BatchRunner(store, settings)
    a, b = settings.replicas_of("cache_aware")
    assert runner.routed(a, WarmOptions()) is not None
    assert runner.semaphore(a, routed=True).try_acquire("restore of a")
    assert not runner.semaphore(b, routed=True).try_acquire("warm-up of b")
    c, _ = settings.replicas_of("kv_aware")  # directly on the replica: its own two slots
    assert runner.routed(c, WarmOptions()) is None
    direct = runner.semaphore(c, routed=False)
    assert direct.try_acquire("one") and direct.try_acquire("two")
    assert not direct.try_acquire("three")


def test_a_restarted_router_that_remembers_is_warmed_through(store, store_url, tmp_path):
    """After a restart, a router that keeps a memory of where prefixes live (``cache_aware``'s
    tree, ``kv_aware``'s event index) has forgotten it: every replica is warmed again, through
    the router whatever the policy's road; a router that spreads remembers nothing."""
    replicas = (ReplicaSettings(url="http://127.0.0.1:8001"),)
    fleets = tuple(
        FleetSettings(name=policy, router_url="http://127.0.0.1:8000", policy=policy,
                      model="m", replicas=replicas)
        for policy in ("cache_aware", "kv_aware", "round_robin")
    )  # fmt: skip
    settings = Settings(redis_url=store_url, store_url=store_url, data_dir=tmp_path, fleets=fleets)
    changes = [{"fleet": f.name, "router_restarted": True} for f in fleets]
    asked: list[tuple[str, str]] = []
    fired = router_restart_warms(settings, store, changes, lambda e, k: asked.append((e, k)) or {},
                                 now=1000.0)  # fmt: skip
    assert sorted(f["detail"]["fleet"] for f in fired) == ["cache_aware", "kv_aware"]
    assert {kind for _, kind in asked} == {ROUTER_RESTARTED}
    (kv_replica,) = settings.replicas_of("kv_aware")
    runner = BatchRunner(store, settings)
    assert runner.routed(kv_replica, WarmOptions()) is None  # its own road: on the replica
    plan = through_router(WarmPlan("p", kv_replica.name, ()))
    assert WarmPlan.from_json(plan.to_json()).road == "through-router"
    assert runner.routed(kv_replica, WarmOptions(road=plan.road)) is not None


@pytest.mark.parametrize("router", ["sglang-router", "vllm-router"])
def test_after_a_router_restart_the_warm_ups_are_spread_not_piled_on_one_replica(
    router, tmp_path, store, store_url
):
    """Users spread over the replicas (3/3/2 for 8 templates sent at once); the router restarts
    with an empty memory; sent one by one, every prime — and every user after — landed on one
    replica (8/0/0). Sent in groups at once, the router places them over more than one."""
    rig = FleetRig(tmp_path, "cache_aware", 3, store, store_url, 280, router=router).start()
    try:
        questions = [(n, f"Q{round_} on {n}?") for round_ in range(3) for n in range(TEMPLATES * 2)]
        for start in range(0, len(questions), TEMPLATES * 2):  # a round's users at once
            with ThreadPoolExecutor(TEMPLATES * 2) as pool:
                list(pool.map(lambda q: rig.send(*q), questions[start : start + TEMPLATES * 2]))
        before = Counter(r for _, r in rig.first_uses(TEMPLATES * 2, "before").values())
        rig.observe()
        rig.router.restart()
        assert sorted(f["kind"] for f in rig.poll()) == ["router_restarted"] * 3
        first = rig.first_uses(TEMPLATES * 2, "after")
        after = Counter(replica for _, replica in first.values())
        print(f"\n{router}: users per replica before {sorted(before.values())}, "
              f"after the restart {sorted(after.values())}")  # fmt: skip
        assert sum(hit for hit, _ in first.values()) == TEMPLATES * 2, first
        # how a router with an empty memory places a group sent at once is its own (by tree
        # size and load, under this machine's timing): measured 6/1/1, 5/2/1, 4/3/1 and 6/2
        # here, where one by one it was 8/0/0 every time
        assert len(after) >= 2, (before, after)
    finally:
        rig.stop()
