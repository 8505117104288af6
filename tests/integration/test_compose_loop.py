"""``docker compose --profile simulator up`` with the example config warms the simulator with
nothing typed: every compose service's own command runs locally (as in ``test_compose``),
sharing one data folder; traffic over chat and completions for a few windows; the simulator
restarts; each template used twice or more must be served from cache on its first request
after the restart, before the next window ends.
"""

from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest
import redis

from tasks.services.loop import window_start
from tasks.settings import load_settings
from tests.integration.processes import template_traffic, wait_loop_warm
from tests.integration.test_compose import LocalStack

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

WINDOW_S = 30
#: the services' health checks on a loaded 2-core machine take up to a minute each
HEALTHY_WITHIN_S = 420.0
WINDOWS_OF_TRAFFIC = 3
#: template number → requests per window (some used once in all: not counted)
TEMPLATES = 10


def head(n: int) -> str:
    return (
        f"You are assistant {n} of Acme's support desk for product line {n * 7}. Answer in at "
        f"most three sentences, quote ticket numbers, and escalate outages to on-call. " * 6
    )


def ask(url: str, n: int, question: str, chat: bool) -> tuple[int, int]:
    """(cached tokens, prompt tokens) of one request for template ``n``."""
    if chat:
        messages = [{"role": "system", "content": head(n)}, {"role": "user", "content": question}]
        body: dict = {"model": "sim-llm", "messages": messages, "max_tokens": 1}
        path = "/v1/chat/completions"
    else:
        body = {"model": "sim-llm", "prompt": head(n) + question, "max_tokens": 1}
        path = "/v1/completions"
    usage = httpx.post(url + path, json=body, timeout=30).raise_for_status().json()["usage"]
    return int(usage["prompt_tokens_details"]["cached_tokens"]), int(usage["prompt_tokens"])


def send_traffic(url: str) -> Counter[tuple[int, bool]]:
    """A few windows of user traffic; requests per (template, chat)."""

    def ask_one(n: int, question: str, chat: bool) -> object:
        return ask(url, n, question, chat)

    return template_traffic(ask_one, WINDOWS_OF_TRAFFIC, WINDOW_S, TEMPLATES)


def restart_and_ask(
    stack: LocalStack, url: str, used: Counter[tuple[int, bool]]
) -> tuple[dict | None, float, float, float, dict]:
    """The simulator restarted as a deploy restarts it (the same command, the same port), the
    replica warm-up waited for until the next window ends, then one first request per template
    and endpoint used twice or more: (the warm-up's outcome, when they were answered, the
    deadline, the share served from cache, each one's (cached, prompt) tokens)."""
    sim = stack.services["simulator"]
    sim.stop()
    restarted = time.time()
    sim.start()
    deadline = window_start(restarted, WINDOW_S) + 2 * WINDOW_S  # the next window's end
    store = redis.Redis.from_url(load_settings(stack.services["beat"].env).store_redis_url)
    outcome = wait_loop_warm(store, "simulator", ("replica",), restarted, deadline - 5)
    if outcome is None:  # say how far it got
        print("replica warm-up not done:", store.hget(
            "pw:loop:simulator:plans", "replica"), flush=True)  # fmt: skip
    counted = sorted(key for key, requests in used.items() if requests >= 2)
    results = {key: ask(url, key[0], "A first question after the deploy?", key[1])
               for key in counted}  # fmt: skip
    answered = time.time()
    served = [key for key, (cached, prompt) in results.items() if cached >= 0.5 * prompt]
    share = len(served) / len(counted)
    print(f"served from cache on first use after the restart: {len(served)}/{len(counted)} "
          f"({share:.0%}); replica warm-up {outcome and outcome['planned']} items, "
          f"started {outcome and round(outcome['started'] - restarted, 1)}s after the restart; "
          f"answered {answered - restarted:.1f}s after it (window {WINDOW_S}s); "
          f"{outcome and outcome.get('forecast')}", flush=True)  # fmt: skip
    return outcome, answered, deadline, share, results


def test_the_services_warm_a_restarted_simulator_with_nothing_typed(tmp_path):
    changes = {
        "window_s = 300": f"window_s = {WINDOW_S}",
        "replica_watch_s = 10": "replica_watch_s = 1",
    }
    stack = LocalStack(tmp_path, changes)
    try:
        stack.start()
        stack.wait_healthy(within_s=HEALTHY_WITHIN_S)
        sim = stack.services["simulator"]
        url = f"http://127.0.0.1:{sim.ports[8000]}"
        used = send_traffic(url)

        after = restart_and_ask(stack, url, used)
        outcome, answered, deadline, share, results = after
        assert outcome is not None, stack.services["worker-ingest"].log_tail()
        assert answered <= deadline
        assert share >= 0.95, results
    finally:
        stack.stop()
