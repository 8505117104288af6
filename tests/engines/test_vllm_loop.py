"""Real vLLM CPU: prewarm runs itself. The compose services' own commands (workers, beat, api)
run locally against their own Redis, configured with one vLLM engine whose log
(``--enable-log-requests`` at ``VLLM_LOGGING_LEVEL=DEBUG``) is the engine's ``vllm-log``
source and a template repository signed webhooks announce. Nothing is typed: no ``prewarm``
command, no task sent by the test; it only sends user traffic and reads the store.

1. Traffic over chat and completions for a few windows; vLLM restarts on the same port (its log
   appended); the loop warms it (its replica watch, or else a window tick). Each template used
   twice or more must be served from cache (``usage.prompt_tokens_details.cached_tokens > 0``)
   on its first request after the restart, for at least 90 % of them; a template never seen
   before must not be (the control). prewarm's own warm-ups are in that log too: the loop must
   not read them back as demand.
2. A template change pushed through a signed GitHub webhook to the api service is re-warmed;
   afterwards a chat user and a completions user of the changed template are both served from
   cache on their first request.

Marked ``vllm`` (one engine start and one restart, 3-4 minutes on 2 cores, measured); run it with::

    flock /tmp/prewarm-vllm.lock python -m pytest -m vllm -s tests/engines/test_vllm_loop.py
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import git
import httpx
import jinja2
import pytest
import redis

from benchmarks.engines.engine import (
    CPU_BLOCK_TOKENS,
    SERVED_NAME,
    VllmServer,
    missing_prerequisites,
)
from benchmarks.rewarm_stack import post_github_push, wait_rewarm
from jobs.embedded import free_port
from tests.integration.processes import template_traffic, wait_loop_warm
from tests.integration.test_compose import LocalStack

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(1500)]

ENGINE = "vllm-cpu"
#: the services the loop needs: workers for every queue, beat, and the api (webhooks)
SERVICES = ("worker-ingest", "worker-model", "worker-warm", "beat", "api")
WINDOW_S = 30
WINDOWS_OF_TRAFFIC = 3
#: templates 0-7 are sent over both endpoints in every window; 8 and 9 once in all
TEMPLATES = 10
#: after the restart, the loop's warm-up must be done within this many seconds of readiness
WARM_WITHIN_S = 150.0
REPO = "acme/prompts"
SECRET = "vllm-loop-secret"
TEMPLATE_PATH = "prompts/billing.jinja"
BILLING = (
    "You are the billing assistant of Acme Corporation. Answer in two sentences at most, quote "
    "the invoice number, never promise a refund, and link the billing policy page when asked "
    "about charges that look wrong. " * 5 + "Customer: {{ customer }}\nQuestion: {{ question }}\n"
)


def head(n: int) -> str:
    """Template ``n``'s static head: about 540 tokens of this model, four whole blocks."""
    return (
        f"Template {n}: you are assistant {n} of the Acme support desk for product line {n * 7}. "
        "Answer in at most three sentences, quote ticket numbers, and escalate outages to "
        "on-call. " * 10
    )


def usage_of(url: str, body: dict, chat: bool) -> tuple[int, int]:
    """(cached tokens, prompt tokens) of one ``max_tokens=1`` request."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"model": SERVED_NAME, "max_tokens": 1, "temperature": 0.0, **body}
    usage = httpx.post(url + path, json=body, timeout=120).raise_for_status().json()["usage"]
    return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0), int(
        usage["prompt_tokens"]
    )


def ask(url: str, system: str, question: str, chat: bool) -> tuple[int, int]:
    """A user of a template: its text as the system message (chat) or as the prompt's head."""
    if chat:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        return usage_of(url, {"messages": messages}, chat=True)
    return usage_of(url, {"prompt": system + question}, chat=False)


def config_toml(engine_url: str, log_path: Path, repo: Path) -> str:
    """The settings every service reads: one vLLM engine, its log as its source, one repo."""
    return f"""
[[engines]]
name = "{ENGINE}"
url = "{engine_url}"
model = "{SERVED_NAME}"
kind = "vllm"
max_concurrency = 2
cache_block_tokens = {CPU_BLOCK_TOKENS}

[[sources]]
engine = "{ENGINE}"
kind = "vllm-log"
path = "{log_path}"

[[template_repos]]
name = "{REPO}"
url = "{repo}"
webhook_secret = "{SECRET}"

[budget]
max_items = 100
max_seconds = 120
batch_size = 8

[schedule]
window_s = {WINDOW_S}
wal_sweep_s = 30
replica_watch_s = 1
# the re-warm must come from the webhook, not from a poll
poll_repos_s = 3600
"""


@dataclass
class LoopStack:
    """The running engine and services, and handles the tests need."""

    engine: VllmServer
    stack: LocalStack
    store: redis.Redis
    api_url: str
    repo: git.Repo
    repo_root: Path

    def commit(self, text: str, message: str) -> str:
        (self.repo_root / TEMPLATE_PATH).write_text(text)
        self.repo.git.add("--all")
        return str(self.repo.index.commit(message).hexsha)

    def push_webhook(self, before: str, after: str) -> httpx.Response:
        """A signed GitHub push delivery for ``before..after`` to the api service."""
        return post_github_push(self.api_url, SECRET, REPO, before, after)

    def wait_rewarm(self, sha: str, timeout_s: float = 240.0) -> dict:
        """The re-warm record of ``sha`` once it committed or rolled back (from the store)."""
        return wait_rewarm(self.store, REPO, sha, timeout_s, poll_s=0.5)


def _wait_services(stack: LocalStack, api_url: str, within_s: float = 300.0) -> None:
    """Workers ready (their own log says so) and the api answering ``/health``."""
    deadline = time.monotonic() + within_s
    pending = {n for n in SERVICES if n.startswith("worker")}
    api_up = False
    while (pending or not api_up) and time.monotonic() < deadline:
        for name, service in stack.services.items():
            assert service.proc.poll() is None, f"{name} exited:\n{service.log_tail()}"
        pending = {n for n in pending if " ready." not in _log(stack, n)}
        try:
            api_up = httpx.get(f"{api_url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            api_up = False
        time.sleep(1.0)
    assert not pending and api_up, {n: stack.services[n].log_tail() for n in pending or SERVICES}


def _log(stack: LocalStack, name: str) -> str:
    return (stack.services[name].workdir / "service.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def loop_stack(tmp_path_factory) -> Iterator[LoopStack]:
    reason = missing_prerequisites()
    if reason:
        pytest.skip(reason)
    from tasks.settings import load_settings

    tmp = tmp_path_factory.mktemp("vllm-loop")
    repo_root = tmp / "prompts"
    repo = git.Repo.init(repo_root, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "Test").set_value("user", "email", "t@example.com")
    (repo_root / TEMPLATE_PATH).parent.mkdir(parents=True)

    stack = LocalStack(tmp, only=SERVICES)
    engine = VllmServer(port=free_port(), log_path=tmp / "vllm" / "engine.log")
    stack.config_path.write_text(config_toml(engine.url, engine.log_path, repo_root))
    settings = load_settings(stack.services["beat"].env)
    store = redis.Redis.from_url(settings.store_redis_url)
    api_url = f"http://127.0.0.1:{stack.services['api'].ports[8080]}"
    handle = LoopStack(engine, stack, store, api_url, repo, repo_root)
    handle.commit(BILLING, "first")
    try:
        stack.start()
        ready_s = engine.start(timeout=400)
        _wait_services(stack, api_url)
        print(f"\nvLLM ready in {ready_s:.1f}s; services ready", flush=True)
        yield handle
    finally:
        engine.stop()
        stack.stop()


def send_traffic(url: str) -> Counter[tuple[int, bool]]:
    """A few windows of user traffic; requests per (template, chat)."""

    def ask_one(n: int, question: str, chat: bool) -> object:
        return ask(url, head(n), question, chat)

    return template_traffic(ask_one, WINDOWS_OF_TRAFFIC, WINDOW_S, TEMPLATES)


def test_the_loop_warms_a_restarted_vllm_with_nothing_typed(loop_stack):
    engine, store = loop_stack.engine, loop_stack.store
    used = send_traffic(engine.url)

    engine.stop()  # a deploy: the same command starts a fresh replica on the same port
    restarted = time.time()
    ready_s = engine.start(timeout=400)
    ready = time.time()
    outcome = wait_loop_warm(store, ENGINE, ("replica", "window"), restarted, ready + WARM_WITHIN_S)
    warmed = time.time()

    counted = sorted(key for key, requests in used.items() if requests >= 2)
    results = {key: ask(engine.url, head(key[0]), "A first question after the deploy?", key[1])
               for key in counted}  # fmt: skip
    control = ask(engine.url, head(99), "A template nobody used before?", False)
    served = {key for key, (cached, _) in results.items() if cached > 0}
    per_endpoint = {
        name: f"{sum(k in served for k in counted if k[1] == chat)}/"
        f"{sum(k[1] == chat for k in counted)}"
        for name, chat in (("chat", True), ("completions", False))
    }
    # template number, then "c" for a chat user or "p" for a completions (prompt) user
    tokens = {f"{n}{'c' if chat else 'p'}": f"{c}/{p}" for (n, chat), (c, p) in results.items()}
    numbers = {
        "served_from_cache": f"{len(served)}/{len(counted)}",
        "share": round(len(served) / len(counted), 3),
        "per_endpoint": per_endpoint,
        "cached/prompt tokens": tokens,
        "control cached/prompt": f"{control[0]}/{control[1]}",
        "engine_restart_to_ready_s": round(ready_s, 1),
        "ready_to_warm_done_s": round(warmed - ready, 1),
        "warm_plan": outcome
        and {k: outcome.get(k) for k in ("reason", "planned", "tokens", "forecast", "status")},
        "warm_report": outcome
        and {k: outcome["report"].get(k) for k in ("items", "items_ok", "items_failed")},
    }
    print("\nvLLM loop:", json.dumps(numbers), flush=True)
    if outcome is None:
        from tasks.adapters.redis_keys import LOOP_LAST_PLANS

        print("no warm-up done:", store.hgetall(LOOP_LAST_PLANS.format(engine=ENGINE)), flush=True)
    assert outcome is not None, loop_stack.stack.services["worker-ingest"].log_tail()
    assert control[0] == 0, control
    assert numbers["share"] >= 0.9, numbers


def test_a_pushed_template_change_is_served_from_cache_to_chat_and_completions(loop_stack):
    engine = loop_stack.engine
    first = loop_stack.repo.head.commit.hexsha
    assert loop_stack.push_webhook("0" * 40, first).status_code == 202
    assert loop_stack.wait_rewarm(first)["state"] == "committed"

    # The change is in the first sentence: no block of the old version's head is reused.
    edited = BILLING.replace("You are the billing assistant", "You are Acme's invoice desk", 1)
    second = loop_stack.commit(edited, "shorter answers")
    response = loop_stack.push_webhook(first, second)
    assert response.status_code == 202, response.text
    record = loop_stack.wait_rewarm(second)

    template = jinja2.Template(edited)
    completion_user = template.render(customer="Bob", question="why was I charged twice?")
    chat_user = template.render(customer="Ann", question="where is my invoice?")
    completion = ask(engine.url, completion_user, "", chat=False)
    chat = ask(engine.url, chat_user, "Thanks!", chat=True)
    numbers = {
        "rewarm": {k: record.get(k) for k in ("state", "warm", "items", "error")},
        "completions user cached/prompt": f"{completion[0]}/{completion[1]}",
        "chat user cached/prompt": f"{chat[0]}/{chat[1]}",
    }
    print("\nvLLM template push:", json.dumps(numbers), flush=True)
    assert record["state"] == "committed", record
    assert completion[0] > 0 and chat[0] > 0, numbers
