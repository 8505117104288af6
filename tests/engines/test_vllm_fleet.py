"""Real vLLM CPU fleet, KV events the only source: templates are served from cache on their first
use through the router after (a) a rolling restart of every replica and (b) a restart of the
router and the replicas.

Two vLLM CPU replicas (INFO, no request logging, KV events, prefix caching, ``--enforce-eager``,
``--enable-scale-out`` for the router's render calls) behind the real ``vllm-router`` 0.1.17
with ``cache_aware`` (warm-ups through the router, as token-id prompts: the router keys its
prefix tree on the tokens it renders a chat into, so a template's token ids teach it where the
template lives) and with ``kv_aware`` (the router reads the replicas' KV events; warm-ups go to
the replica directly). prewarm runs as its services do: one ``prewarm kv-events`` per replica,
``prewarm watch`` and a real Celery worker, configured with one ``[[fleets]]`` entry whose
replicas carry their KV-event endpoints. Users send each template (a system prompt filling six
128-token blocks) as chats through the router, three times each, two users at once. After each
scenario, one new chat per template through the router; served from cache when
``usage.prompt_tokens_details.cached_tokens`` is at least half its prompt. Goal (issue: "warm
the fleet users actually reach"): at least 90% in each scenario, for both policies. Prints a
table: hits, and per replica the warm-up requests and prompt tokens it served (its own
``/metrics``).

Marked ``vllm``; run with (5-6 minutes per policy here, eight engine starts each)::

    flock /tmp/prewarm-vllm.lock python -m pytest -m vllm -s tests/engines/test_vllm_fleet.py
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from benchmarks.engines.engine import missing_prerequisites
from benchmarks.engines.kv_vllm import prose
from tests.engines.vllm_fleet import Scenario, VllmFleet
from tests.integration.processes import wait_for
from tests.integration.router import router_binary

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(3600)]
TEMPLATES, USES, WORDS = 6, 3, 450  # 450 words: chats of about 850 tokens, six whole blocks


@pytest.fixture
def fleet_ready(broker_url: str) -> None:
    reason = missing_prerequisites()
    if reason:
        pytest.skip(reason)
    router_binary()  # (skips without vllm-router, fails in CI)


def _templates() -> list[str]:
    rng = random.Random(7)
    return [f"Template {n}. You are assistant {n} of the support desk. " + prose(rng, WORDS)
            for n in range(TEMPLATES)]  # fmt: skip


def _rolling(fleet: VllmFleet, settle: Callable[[], list[dict[str, Any]]]) -> list[dict]:
    """Each replica in turn restarts, and prewarm warms it before the next one goes."""
    plans = []
    for replica in fleet.replicas:
        replica.restart()
        plans += settle()
    return plans


def _everything(fleet: VllmFleet, settle: Callable[[], list[dict[str, Any]]]) -> list[dict]:
    """The router stops, every replica restarts, the router starts (an empty memory)."""
    fleet.router.stop()
    for replica in fleet.replicas:
        replica.server.stop()
    fleet.start_replicas()
    fleet.router.start(timeout_s=300)
    return settle()


def _scenario(fleet: VllmFleet, name: str, step: Callable, store: Any, settings: Any,
              templates: list[str]) -> Scenario:  # fmt: skip
    scenario = Scenario(name)
    started = time.monotonic()
    before = fleet.metrics()
    known: set[str] = set(fleet.plan_ids(store))

    def settle() -> list[dict[str, Any]]:
        plans = fleet.settle(store, settings, known)
        known.update(p["plan"] for p in plans)
        return plans

    scenario.plans = step(fleet, settle)
    scenario.requests, scenario.tokens = fleet.served_since(before)
    scenario.first = fleet.first_uses(templates, name)
    scenario.seconds = round(time.monotonic() - started, 1)
    return scenario


@pytest.mark.parametrize("policy", ["cache_aware", "kv_aware"])
def test_templates_served_from_cache_after_fleet_restarts(policy, fleet_ready, tmp_path):
    from tasks.settings import load_settings
    from tests.conftest import STORE_URL

    templates = _templates()
    fleet = VllmFleet(tmp_path, policy)
    env = fleet.environment()
    settings = load_settings(environ=env, config_path=fleet.config)
    store = redis.Redis.from_url(STORE_URL)
    started = time.monotonic()
    scenarios = []
    with fleet.running(env, store) as states:
        fleet.traffic(templates, USES)
        wait_for(lambda: sum(int(s.status().get("held", 0)) for s in states), 60, "events")
        held = {s.engine: int(s.status().get("held", 0)) for s in states}
        for name, step in (("a rolling restart", _rolling),
                           ("b router and replicas", _everything)):  # fmt: skip
            scenarios.append(_scenario(fleet, name, step, store, settings, templates))
            print(scenarios[-1].row(policy, fleet.replicas), flush=True)
    logs = fleet.logs()
    numbers = {
        "policy": policy, "templates": TEMPLATES, "uses": USES, "blocks_held": held,
        "seconds": round(time.monotonic() - started, 1),
        "scenarios": [{"name": s.name, "hits": s.hits, "first_uses": s.first,
                       "warmup_requests": s.requests, "warmup_tokens": s.tokens,
                       "seconds": s.seconds,
                       "plans": [{k: p.get(k) for k in ("plan", "engine", "items", "items_ok",
                                                        "items_failed", "state")}
                                 for p in s.plans]} for s in scenarios],
    }  # fmt: skip
    print(json.dumps(numbers, default=str))
    (tmp_path / "numbers.json").write_text(json.dumps(numbers, indent=1, default=str))
    assert not any(t[:80] in logs for t in templates), "a prompt reached a replica's log"
    assert "Received request" not in logs
    for scenario in scenarios:
        assert sum(scenario.requests.values()) > 0, scenario  # prewarm warmed something
        assert scenario.hits >= 0.9 * TEMPLATES, (policy, scenario.name, scenario.first)
