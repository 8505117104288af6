"""The real ``sglang-router`` (0.3.2, from PyPI) as an operator runs it, with prewarm as its
services run it: the compose services' own commands (workers and beat), nothing typed, three
simulator replicas taken from the router's worker list, ``cache_aware``, eight templates of
about 880 tokens — half of them used as chats, half as text completions.

After (a) a rolling restart, (b) a restart of the router and every replica, and (c) the same
again with the eight users arriving at once: at least 90% of the templates are served from
cache on their first use, and no item is reported verified (held, after its plan, on a replica)
for a template whose first use missed. Prints the table: scenario, first uses from cache, items
reported held for templates that missed. (The replicas are the engine SIMULATOR.) About four
minutes: behind the ``slow`` marker (``python -m pytest -m slow -s`` on this file)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from tasks.adapters import redis_keys
from tasks.adapters.plan_store import PlanStore
from tasks.settings import load_settings
from tests.integration.fleet_rig import Fleet, _read_from
from tests.integration.test_compose import LocalStack
from tests.integration.test_fleet_matrix import SERVICES, plans_since, settings_text, settle

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

TEMPLATES, USES, REPLICAS, WORDS = 8, 3, 3, 280
#: a replica restarted twice within this is warmed once (tasks.adapters.cooldowns)
REPLICA_COOLDOWN_S = 31.0


def first_uses_at_once(fleet: Fleet, tag: str) -> dict[int, tuple[bool, str]]:
    """One new request per template, all sent at once: (served from cache, replica)."""
    before = {name: path.stat().st_size for name, path in fleet.logs().items()}
    questions = {n: f"{tag}: a first question on case {n}?" for n in range(TEMPLATES)}
    with ThreadPoolExecutor(TEMPLATES) as pool:
        usage = dict(
            zip(questions, pool.map(lambda n: fleet.send(n, questions[n]), questions), strict=True)
        )
    logs = {name: _read_from(path, before.get(name, 0)) for name, path in fleet.logs().items()}
    out = {}
    for n, (cached, prompt) in usage.items():
        landed = [name for name, text in logs.items() if questions[n] in text]
        assert len(landed) == 1, (questions[n], landed)
        out[n] = (cached >= prompt // 2, landed[0])
    return out


def reported_held(store: redis.Redis, fleet: Fleet, since: float) -> dict[int, int]:
    """Per template, the items of plans since ``since`` that the post-plan check reported
    held on a replica (checked since ``since``)."""
    plans = PlanStore(store)
    names = [fleet.replica_name(r) for r in fleet.replicas]
    about: dict[str, int] = {}
    for plan_id, report in plans_since(store, names, since).items():
        for batch in range(report["batches"]):
            items, _, _ = plans.load_batch(plan_id, batch)
            for item in items:
                text = item.text or json.dumps(item.messages)
                found = [n for n in range(TEMPLATES) if f"Template {n}. " in text]
                if found:
                    about[item.key] = found[0]
    held: dict[int, int] = {}
    for name in names:
        for key, when in store.hgetall(redis_keys.REPLICA_HELD.format(engine=name)).items():
            n = about.get(key.decode())
            if n is not None and float(when) >= since:
                held[n] = held.get(n, 0) + 1
    return held


def check(
    store: redis.Redis, fleet: Fleet, scenario: str, since: float, first: dict, rows: list[str]
) -> None:
    hits = sum(hit for hit, _ in first.values())
    held = reported_held(store, fleet, since)
    misreported = sum(held.get(n, 0) for n, (hit, _) in first.items() if not hit)
    rows.append(f"| {scenario} | {hits}/{TEMPLATES} | {misreported} |")
    print(rows[-1], flush=True)
    assert hits >= 0.9 * TEMPLATES, (scenario, first)
    assert misreported == 0, (scenario, first, held)


def test_sglang_router_fleet_is_warmed_and_reported_truly(tmp_path: Path):
    (tmp_path / "fleet").mkdir()
    fleet = Fleet(
        tmp_path / "fleet", "cache_aware", REPLICAS, WORDS, name="sglang", router="sglang-router"
    )
    fleet.completions = frozenset(range(1, TEMPLATES, 2))
    (tmp_path / "stack").mkdir()
    stack = LocalStack(tmp_path / "stack", only=SERVICES)
    rows: list[str] = []
    try:
        fleet.start_router()
        stack.config_path.write_text(settings_text([fleet]))
        stack.start()
        stack.wait_healthy()
        store = redis.Redis.from_url(load_settings(stack.services["beat"].env).store_redis_url)
        fleet.traffic(TEMPLATES, USES)
        names = [fleet.replica_name(r) for r in fleet.replicas]
        settle(store, fleet, names, 0.0)  # (the replicas' first warm-ups, as they came up)

        since = time.time()
        for replica in fleet.replicas:
            restarted = time.time()
            replica.restart()
            settle(store, fleet, [fleet.replica_name(replica)], restarted)
        check(store, fleet, "a rolling restart", since, fleet.first_uses(TEMPLATES, "a"), rows)

        time.sleep(max(0.0, since + REPLICA_COOLDOWN_S - time.time()))
        since = time.time()
        fleet.restart_everything()
        settle(store, fleet, names, since)
        check(store, fleet, "b router and replicas", since, fleet.first_uses(TEMPLATES, "b"), rows)

        time.sleep(max(0.0, since + REPLICA_COOLDOWN_S - time.time()))
        since = time.time()
        fleet.restart_everything()
        settle(store, fleet, names, since)
        check(store, fleet, "c as (b), 8 users at once", since,
              first_uses_at_once(fleet, "c"), rows)  # fmt: skip
        print("\n| scenario | first uses from cache | reported held, template missed |")
        print("|---|---|---|")
        print("\n".join(rows))
    finally:
        stack.stop()
        fleet.stop()
