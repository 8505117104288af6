"""Real vLLM CPU behind the real ``vllm-router`` (``power_of_two``), gated: a replica restarted
joins the router only once prewarm has warmed and verified its hot set, so its first requests are
served from cache. prewarm runs as its services do (``prewarm kv-events`` per replica, ``prewarm
watch`` looking every 2 s, a real Celery worker), one ``[[fleets]]`` entry with ``gate = true``.

After the users' history (six templates, chats of about 850 tokens, twice each), replica 0 is
restarted (an empty cache); once the gate admitted it, users send each template again, one
request at a time, and each request's replica is read from the replicas' own
``vllm:request_success_total``. Every request that reached replica 0 must be served from cache
(``usage.prompt_tokens_details.cached_tokens`` at least half the prompt), and at least one must
reach it. Prints the gate's time to ready, the engine's part (``warm``: its prefill of the hot set)
and prewarm's (detection, planning, dispatch, verification).

Marked ``vllm``; run with (about 6 minutes here, three engine starts)::

    flock /tmp/prewarm-vllm.lock python -m pytest -m vllm -s tests/engines/test_vllm_gate.py
"""

from __future__ import annotations

import json
import time

import pytest
import redis

from tests.engines.test_vllm_fleet import _templates, fleet_ready  # noqa: F401 (a fixture)
from tests.engines.vllm_fleet import VllmFleet, replica_metrics
from tests.integration.processes import wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(3600)]

#: a gated replica still cold this long after it came up is admitted anyway (the test fails)
DEADLINE_S = 600
USES = 2


def gated(config: str) -> str:
    """The fleet's settings with the gate on (its replicas are listed)."""
    head = "max_concurrency = 1"
    assert head in config
    return config.replace(head, f"{head}\ngate = true\ngate_deadline_s = {DEADLINE_S}")


def served_by(url: str, send) -> tuple[bool, tuple[int, int]]:
    """Send one request (``send()``, (cached, prompt) tokens) and whether the replica at
    ``url`` finished it (its ``vllm:request_success_total`` grew by one)."""
    before = replica_metrics(url).get("requests", 0.0)
    usage = send()
    return replica_metrics(url).get("requests", 0.0) > before, usage


def test_a_restarted_replica_takes_users_only_once_warm(fleet_ready, tmp_path):  # noqa: F811
    from tasks.adapters import gate_state
    from tests.conftest import STORE_URL

    templates = _templates()
    fleet = VllmFleet(tmp_path, "power_of_two")
    fleet.config.write_text(gated(fleet.config.read_text()))
    store = redis.Redis.from_url(STORE_URL)
    replica = fleet.replicas[0]

    def record():
        return gate_state.load(store, "fleet", replica.name)

    with fleet.running(fleet.environment(), store) as states:
        wait_for(lambda: (r := record()) is not None and r.admits, 120, "first admission")
        fleet.traffic(templates, USES)
        wait_for(lambda: sum(int(s.status().get("held", 0)) for s in states), 60, "events")
        replica.server.stop()
        wait_for(lambda: (r := record()) is not None and not r.admits, 60, "seen down")
        started = time.time()
        replica.server.start()
        ready = wait_for(
            lambda: (r := record()) is not None and r.admits and (r.admitted or 0) > started
            and r, DEADLINE_S, "the restarted replica admitted",
        )  # fmt: skip
        first = [
            served_by(replica.url, lambda s=system, q=f"After {k} on {n}?": fleet.chat(s, q))
            for k in range(USES) for n, system in enumerate(templates)
        ]  # fmt: skip
    landed = [(cached, prompt) for on_it, (cached, prompt) in first if on_it]
    numbers = {
        "state": ready.state.value, "why": ready.why,
        "time_to_ready_s": round(ready.time_to_ready or 0.0, 3),
        "engine_warm_s": round(ready.stages.get("warm", 0.0), 3),
        "prewarm_s": round(ready.prewarm_part(), 3), "stages_s": ready.stages,
        "reached_restarted": len(landed),
        "from_cache": sum(cached >= prompt // 2 for cached, prompt in landed),
        "elsewhere_from_cache": sum(c >= p // 2 for on, (c, p) in first if not on),
        "requests": len(first),
    }  # fmt: skip
    print(json.dumps(numbers), flush=True)
    (tmp_path / "numbers.json").write_text(json.dumps(numbers, indent=1))
    assert ready.state.value == "ready", numbers
    assert landed, numbers
    assert numbers["from_cache"] == len(landed), (numbers, landed)
