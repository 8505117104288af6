"""A template change pushed through a signed webhook re-warms the gateway's entries of the
changed template's frequent requests: the real LiteLLM proxy (its Redis cache on, prewarm's
callback as the engine's source) in front of the simulator, a git repository of templates, the
webhook app on real HTTP and a real worker.

Clients render two templates into chat requests and repeat them. After the billing template's
head changes in git and the push is delivered, the billing requests as the new version renders
them must be answered from LiteLLM's cache on their first use (``x-litellm-cache-key``), and
the translation template's requests, unchanged, keep their entries.

Marked ``slow`` with the other LiteLLM test: LiteLLM lives in an environment of its own
(``tests/integration/litellm_proxy.py``), which the default install does not have.
"""

from __future__ import annotations

import time
import uuid
from contextlib import ExitStack

import git
import jinja2
import pytest

from benchmarks.rewarm_stack import post_github_push
from benchmarks.stack import in_process_submitter
from jobs.embedded import WorkerProcess, serve_app
from jobs.simulator import SimulatorConfig, SimulatorServer
from jobs.webhooks import webhook_app
from tasks.adapters.store import store_client
from tasks.repo_tasks import queue_repo_changed
from tasks.services.loop import WarmLoop
from tasks.settings import load_settings
from tests.conftest import worker_env
from tests.integration.litellm_proxy import CacheRedis, LitellmProxy, proxy_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO, SECRET, NAMESPACE = "acme/prompts", "gateway-secret", "gw"
BILLING = (
    "You are the billing assistant of Acme Corporation. Answer in two sentences at most, quote "
    "the invoice number and never promise a refund. Customer: {{ customer }}. Plan: {{ plan }}."
)
TRANSLATE = "Translate into formal French, keeping names unchanged: {{ text }}"
CUSTOMERS = [("Ann", "gold"), ("Bob", "basic"), ("Cy", "team"), ("Di", "gold")]
TEXTS = ["Good morning, Mr Smith.", "The invoice is attached.", "See you on Monday."]


def chat(system: str, question: str) -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": "sim-llm", "messages": messages, "temperature": 0, "max_tokens": 8}


def billing_requests(template: str) -> list[dict]:
    render = jinja2.Template(template).render
    return [chat(render(customer=c, plan=p), "Why was I charged twice?") for c, p in CUSTOMERS]


def translate_requests() -> list[dict]:
    render = jinja2.Template(TRANSLATE).render
    return [chat(render(text=t), "Please.") for t in TEXTS]


def in_process(store, settings):
    """The loop's submitter running every batch here, through the real WAL (unordered)."""
    return in_process_submitter(store, settings, ordered=False)


def wait_txn(store, sha: str, timeout_s: float = 120.0) -> dict:
    import json

    key = f"pw:templates:{REPO}:txn:{sha}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        raw = store.get(key)
        if raw and json.loads(raw)["state"] in ("committed", "rolled_back"):
            return json.loads(raw)
        time.sleep(0.1)
    raise AssertionError(f"no re-warm record for {sha}")


def test_a_pushed_template_change_rewarms_the_gateways_entries_of_that_template(
    tmp_path, celery_app_configured, store_url
):
    src = tmp_path / "src"
    source = git.Repo.init(src, initial_branch="main")
    with source.config_writer() as config:
        config.set_value("user", "name", "Test").set_value("user", "email", "t@example.com")

    def commit(text: str) -> str:
        (src / "prompts").mkdir(exist_ok=True)
        (src / "prompts" / "billing.jinja").write_text(text)
        (src / "prompts" / "translate.jinja").write_text(TRANSLATE)
        source.git.add("--all")
        return source.index.commit("edit").hexsha

    with ExitStack() as stack:
        cache = CacheRedis(tmp_path)
        stack.callback(cache.stop)
        sim = stack.enter_context(SimulatorServer(SimulatorConfig()))
        log = tmp_path / "litellm-requests.jsonl"
        proxy = LitellmProxy(tmp_path, proxy_config(sim.url, ["sim-llm"], cache, NAMESPACE, 3600),
                             log)  # fmt: skip
        stack.callback(proxy.stop)
        proxy.wait_ready()
        config = tmp_path / "prewarm.toml"
        config.write_text(f"""
data_dir = "{tmp_path / "data"}"
redis_url = "{store_url}"
[[engines]]
name = "sim"
url = "{sim.url}"
model = "sim-llm"
kind = "simulator"
[[sources]]
engine = "sim"
kind = "litellm"
path = "{log}"
[[gateways]]
name = "edge"
url = "{proxy.url}"
key = "sk-prewarm-test"
engine = "sim"
cache_url = "{cache.url()}"
[[template_repos]]
name = "{REPO}"
url = "{src}"
webhook_secret = "{SECRET}"
""")
        settings = load_settings({}, config)
        store = store_client(settings)
        queue = f"gw-rewarm-{uuid.uuid4().hex[:8]}"
        worker = WorkerProcess(config, tmp_path / "worker.log", env=worker_env(), queues=queue,
                               pool="solo")  # fmt: skip
        stack.callback(worker.stop)
        worker.wait_ready(180)  # a loaded 2-core machine starts slowly
        enqueue = lambda repo, before, after: queue_repo_changed(repo, before, after, queue=queue)  # noqa: E731
        url = stack.enter_context(serve_app(webhook_app(settings=settings, store=store,
                                                        enqueue=enqueue)))  # fmt: skip

        first = commit(BILLING)
        assert post_github_push(url, SECRET, REPO, "0" * 40, first).status_code == 202
        assert wait_txn(store, first)["state"] == "committed"

        clients = billing_requests(BILLING) + translate_requests()
        for _ in range(2):  # every request asked twice, as clients do
            for body in clients:
                proxy.post("/v1/chat/completions", body, f"client-{uuid.uuid4().hex}")
        time.sleep(1.0)  # the callback writes after each answer
        loop = WarmLoop(settings, store, submit=in_process(store, settings))
        assert loop.warm_now("sim", "cli")["status"] == "submitted"  # the loop reads the log

        edited = BILLING.replace("two sentences", "one sentence")
        second = commit(edited)
        delivery = post_github_push(url, SECRET, REPO, first, second)
        assert delivery.status_code == 202
        record = wait_txn(store, second)
        assert record["state"] == "committed" and record["warm"] == ["prompts/billing.jinja"]

        new_billing = billing_requests(edited)
        assert not set(map(str, new_billing)) & set(map(str, clients))  # never asked before
        hits = {}
        for name, bodies in (("billing", new_billing), ("translate", translate_requests())):
            answers = [proxy.post("/v1/chat/completions", b, f"next-{uuid.uuid4().hex}")
                       for b in bodies]  # fmt: skip
            hits[name] = sum(bool(a.headers.get("x-litellm-cache-key")) for a in answers)
        print(f"\nre-warm of {second[:8]}: {record['items']} items; first uses answered from the "
              f"gateway's cache: billing (changed) {hits['billing']}/{len(new_billing)}, "
              f"translate (unchanged) {hits['translate']}/{len(TEXTS)}")  # fmt: skip
        assert hits == {"billing": len(new_billing), "translate": len(TEXTS)}
        # the template's head items (completions and chat) and one entry per billing request
        assert record["items"] == 2 + len(new_billing)
