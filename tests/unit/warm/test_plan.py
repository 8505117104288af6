"""Plans: scores, budgets, tenant shares, profile representatives, priming order."""

from __future__ import annotations

import pytest

from pipeline.errors import BadInputError
from pipeline.planner.plan import EngineCost, PlanBudget, WarmItem, WarmPlan
from pipeline.planner.select import build_plan, priming_order, score_item, with_cache_salt

COST = EngineCost(prefill_s_per_token=1e-3, request_overhead_s=0.01)


def item(key, hits, tokens=100, tenant="default", profile=None, **kw):
    return WarmItem("prefix", key, "m", text=f"text {key}", tenant=tenant, tokens=tokens,
                    predicted_hits=hits, profile=profile, **kw)  # fmt: skip


def test_with_a_block_size_each_item_keeps_its_whole_blocks_plus_one_in_flight():
    # 3 x 300 tokens are over 700 tokens, but each keeps only 2 whole blocks of 128 cached (its
    # partial block and output token are freed to be reused); one block is needed in flight
    cands = [item("a", 9, 300), item("b", 8, 300), item("c", 7, 300)]
    loose = build_plan("e", cands, PlanBudget(max_items=10, max_tokens=700), COST)
    blocks = build_plan("e", cands, PlanBudget(max_items=10, max_tokens=900, block_tokens=128),
                        COST)  # fmt: skip
    assert [i.key for i in loose.items] == ["b", "a"]
    assert [i.key for i in blocks.items] == ["c", "b", "a"]  # 6 blocks kept + 1 in flight
    tight = build_plan("e", cands, PlanBudget(max_items=10, max_tokens=768, block_tokens=128),
                       COST)  # fmt: skip
    assert [i.key for i in tight.items] == ["b", "a"]  # 768 = 6 blocks: none left in flight
    assert PlanBudget(block_tokens=128).cache_tokens(item("x", 1, 255)) == 128
    assert PlanBudget(block_tokens=128).cache_tokens(item("x", 1, 256)) == 256
    assert PlanBudget(block_tokens=128).cached_tokens(item("x", 1, 256)) == 128  # not the last


def test_score_is_time_saved_minus_warm_cost():
    a = item("a", hits=10, tokens=200)
    assert score_item(a, COST) == pytest.approx(10 * 0.2 - COST.warm_cost_weight * (0.2 + 0.01))
    full = EngineCost(prefill_s_per_token=1e-3, request_overhead_s=0.01, warm_cost_weight=1.0)
    assert score_item(a, full) == pytest.approx(10 * 0.2 - (0.2 + 0.01))
    assert score_item(a, COST, weight=2.0) > score_item(a, COST)
    assert score_item(item("cold", hits=0), COST) < 0


def test_token_budget_keeps_the_most_valuable_and_primes_it_last():
    cands = [item("small", 3, 100), item("big", 9, 400), item("mid", 5, 300), item("cold", 0, 50)]
    plan = build_plan("e", cands, PlanBudget(max_items=10, max_tokens=700), COST)
    keys = [i.key for i in plan.items]
    assert set(keys) == {"big", "mid"}  # 700 tokens: the two best; the cold one scores < 0
    assert keys[-1] == "big"
    assert plan.tokens <= 700
    assert plan.dropped == 2


def test_a_binding_token_budget_goes_by_seconds_saved_per_token():
    # one long, rarely used prefix against two shorter, busier ones that fit together
    cands = [item("long", 4, 1400), item("busy", 8, 620), item("busier", 7, 740)]
    plan = build_plan("e", cands, PlanBudget(max_items=10, max_tokens=1400), COST)
    assert {i.key for i in plan.items} == {"busy", "busier"}
    assert plan.tokens <= 1400


def test_a_cache_with_room_warms_an_item_predicted_at_one_hit():
    # warming is paid off the users' path: one expected hit is worth it when the cache has room
    cands = [item("once", 1.0, 800), item("twice", 2.0, 1200), item("never", 0.0, 500)]
    plan = build_plan("e", cands, PlanBudget(max_items=10, max_tokens=10_000), COST)
    assert {i.key for i in plan.items} == {"once", "twice"}
    assert [i.key for i in plan.items][-1] == "twice"


def test_warm_cost_breaks_ties_when_the_budget_binds():
    # both save the same time (hits × tokens); the one cheaper to warm takes the only slot
    cheap, dear = item("cheap", 2.0, 300), item("dear", 2.0 * 300 / 310, 310)
    plan = build_plan("e", [dear, cheap], PlanBudget(max_items=1), COST)
    assert [i.key for i in plan.items] == ["cheap"]


def test_item_and_time_budgets():
    cands = [item(str(n), hits=n + 1) for n in range(10)]
    assert len(build_plan("e", cands, PlanBudget(max_items=3), COST).items) == 3
    # each item costs 0.11 s at concurrency 1: 0.35 s fits three
    timed = build_plan("e", cands, PlanBudget(max_seconds=0.35, concurrency=1), COST)
    assert len(timed.items) == 3


def test_tenant_shares_and_weights():
    cands = [item(f"a{n}", 10, tenant="a") for n in range(5)] + [
        item(f"b{n}", 3, tenant="b") for n in range(5)
    ]
    plan = build_plan("e", cands, PlanBudget(max_items=4), COST, shares={"a": 0.5, "b": 0.5})
    tenants = [i.tenant for i in plan.items]
    assert tenants.count("a") == 2 and tenants.count("b") == 2
    weighted = build_plan("e", cands, PlanBudget(max_items=4), COST, weights={"b": 100.0})
    assert all(i.tenant == "b" for i in weighted.items)


def test_every_profile_keeps_a_representative_even_when_cold():
    cands = [item(f"hot{n}", 50, profile="chat") for n in range(5)] + [
        item("batch-rep", 0, profile="batch"),
        item("batch-2", 0, profile="batch"),
    ]
    plan = build_plan("e", cands, PlanBudget(max_items=3), COST)
    profiles = [i.profile for i in plan.items]
    assert profiles.count("batch") == 1 and profiles.count("chat") == 2


def test_soonest_needed_is_primed_last():
    later = item("later", 5, next_use_s=100.0)
    sooner = item("sooner", 1, next_use_s=5.0)
    assert [i.key for i in priming_order([sooner, later])] == ["later", "sooner"]


def test_plan_json_round_trip_and_bad_input():
    chat = WarmItem("prefix", "c", "m", messages=({"role": "system", "content": "be brief"},),
                    endpoint="chat", tokens=3, predicted_hits=2)  # fmt: skip
    plan = build_plan("e", [item("a", 5), chat], PlanBudget(), COST)
    again = WarmPlan.from_json(plan.to_json())
    assert again == plan
    with pytest.raises(BadInputError, match=r"items\[0\]"):
        WarmPlan.from_json('{"plan_id": "p", "engine": "e", "items": [{"kind": "nope"}]}')
    with pytest.raises(BadInputError):
        WarmItem("prefix", "x", "m")


def test_cache_salt_only_with_tenant_isolation():
    plan = build_plan("e", [item("a", 5, tenant="acme")], PlanBudget(), COST)
    assert "cache_salt" not in plan.items[0].params
    salted = with_cache_salt(plan, isolate_tenants=True)
    assert salted.items[0].params["cache_salt"] == "acme"


def test_a_plan_cannot_smuggle_request_fields():
    with pytest.raises(BadInputError, match="unknown request fields"):
        WarmItem("prefix", "k", "m", text="t", params={"model": "other", "api_base": "http://x"})
    assert WarmItem("prefix", "k", "m", text="t", params={"cache_salt": "a"}).params


def test_what_prewarm_warm_prints_for_a_plan_it_found_finished():
    from jobs.cmd_warm import outcome

    stale = {"done": True, "state": "submitted", "seconds": -41.2, "items_failed": 0}
    shown = outcome(stale, [{"batch": 0, "state": "committed", "failed": 0}], elapsed_s=0.4)
    assert shown["state"] == "finished" and shown["seconds"] == 0.4 and shown["ok"]
    batches = [{"batch": 0, "state": "committed", "failed": 1, "failures": ["k: x"]},
               {"batch": 1, "state": "rolled_back", "failed": 4}]  # fmt: skip
    report = {"done": True, "state": "finished", "seconds": 2.0, "items_failed": 1}
    failed = outcome(report, batches, elapsed_s=3.0)
    assert not failed["ok"] and failed["seconds"] == 2.0
    assert [b["batch"] for b in failed["failed_batches"]] == [0, 1]
    running = outcome({"done": False, "state": "submitted"}, [], elapsed_s=600.0)
    assert running["state"] == "submitted" and not running["ok"]
