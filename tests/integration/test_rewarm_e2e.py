"""Push → webhook → re-warm → the new version is served, on a real worker and the simulator."""

from __future__ import annotations

import httpx
import pytest

from benchmarks.rewarm_stack import REPO, rewarm_stack
from tasks.adapters.template_serving import serving

pytestmark = pytest.mark.integration

HEAD = (
    "You are the billing assistant of Acme Corporation. Answer in two sentences at most, quote "
    "the invoice number, never promise a refund, and link the billing policy page when asked "
    "about charges that look wrong. "
)
SUPPORT = HEAD + "Customer: {{ customer }}\nQuestion: {{ question }}\n"
OTHER = (
    "Translate the following text into formal French, keeping names unchanged. " * 3 + "{{ text }}"
)


def _cached_tokens(url: str, prompt: str) -> int:
    body = {"model": "sim-llm", "prompt": prompt, "max_tokens": 1}
    usage = httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()["usage"]
    return int(usage["prompt_tokens_details"]["cached_tokens"])


def _chat_cached_tokens(url: str, system: str, question: str) -> tuple[int, int]:
    """(cached, prompt) tokens of a chat user whose system message is the rendered template."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    body = {"model": "sim-llm", "messages": messages, "max_tokens": 1}
    usage = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30).json()["usage"]
    return int(usage["prompt_tokens_details"]["cached_tokens"]), int(usage["prompt_tokens"])


def test_push_webhook_rewarms_and_serves_the_new_version(
    tmp_path, celery_app_configured, store_url
):
    files = {"prompts/billing.jinja": SUPPORT, "prompts/translate.jinja": OTHER}
    with rewarm_stack(tmp_path, store_url, files) as stack:
        first = stack.source.head.commit.hexsha
        assert stack.push_webhook("0" * 40, first).status_code == 202
        assert stack.wait_txn(first)["state"] == "committed"
        old = serving(stack.store, REPO)["prompts/billing.jinja"]
        assert len(serving(stack.store, REPO)) == 2

        edited = SUPPORT.replace("two sentences", "one sentence")
        second = stack.commit({"prompts/billing.jinja": edited})
        response = stack.push_webhook(first, second)
        assert response.status_code == 202 and response.json()["task_id"]
        record = stack.wait_txn(second)
        assert record["state"] == "committed", record
        # one item for completions users, one for chat users (the head as system message)
        assert record["warm"] == ["prompts/billing.jinja"] and record["items"] == 2

        now = serving(stack.store, REPO)
        assert now["prompts/billing.jinja"]["version"] != old["version"]
        assert (
            now["prompts/translate.jinja"] == serving(stack.store, REPO)["prompts/translate.jinja"]
        )
        new_head = now["prompts/billing.jinja"]["static_prefix"]
        assert "one sentence" in new_head
        # The engine already holds the new version's head: a real request hits the cache.
        prompt = new_head + "Customer: Bob\nQuestion: why was I charged twice?\n"
        completion_cached = _cached_tokens(stack.engine_url, prompt)
        assert completion_cached >= 16
        # ... and so does a chat user of the same template, through the chat template: every
        # whole block of the head (the chat header shifts it by a few tokens: one block at most)
        rendered = new_head + "Customer: Ann\nQuestion: where is my invoice?\n"
        cached, prompt_tokens = _chat_cached_tokens(stack.engine_url, rendered, "Thanks!")
        assert cached >= max(16, completion_cached - 16), (cached, prompt_tokens)

        # The same delivery content again (a new delivery id) finds nothing left to do.
        again = stack.push_webhook(first, second)
        assert again.status_code == 202


def test_a_failed_rewarm_keeps_the_old_version_serving_until_a_retry_commits(
    tmp_path, celery_app_configured, store_url
):
    with rewarm_stack(tmp_path, store_url, {"prompts/billing.jinja": SUPPORT}) as stack:
        first = stack.source.head.commit.hexsha
        assert stack.push_webhook("0" * 40, first).status_code == 202
        assert stack.wait_txn(first)["state"] == "committed"
        old = serving(stack.store, REPO)["prompts/billing.jinja"]["version"]

        stack.sim.stop()  # the engine is down while the push arrives
        second = stack.commit({"prompts/billing.jinja": SUPPORT.replace("Acme", "Acme Ltd")})
        assert stack.push_webhook(first, second).status_code == 202
        failed = stack.wait_txn(second, states=("rolled_back",))
        assert "sim" in failed["error"]
        assert serving(stack.store, REPO)["prompts/billing.jinja"]["version"] == old

        stack.sim.start()  # back on the same port: the task's retry goes through
        assert stack.wait_txn(second, timeout=90, states=("committed",))["state"] == "committed"
        assert serving(stack.store, REPO)["prompts/billing.jinja"]["version"] != old
