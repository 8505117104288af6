"""Router kinds as prewarm drives them: each kind's worker list read from its own route and
shape, a route of another kind refused (never an empty fleet), chat prefixes read back from
their rendered text for routers keyed on text."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.chat_forms import chat_messages
from pipeline.errors import EngineUnavailableError
from pipeline.planner.plan import WarmItem
from pipeline.router_kinds import RouterApiError, policy_problem, router_kind
from tasks.adapters.router_client import RouterClient
from tasks.adapters.targets.routed import as_users_send
from tasks.settings.fleets import FleetSettings

SGLANG_WORKERS = {"workers": [
    {"id": "33ea", "url": "http://10.0.0.2:8000/", "is_healthy": True, "load": 0},
    {"id": "0e85", "url": "http://10.0.0.1:8000", "is_healthy": False, "load": 0},
]}  # fmt: skip


def fleet(kind: str) -> FleetSettings:
    return FleetSettings(name="f", router_url="http://router:30000", router=kind,  # type: ignore[arg-type]
                         model="m", replicas_from="router")  # fmt: skip


def client(kind: str, routes: dict[str, httpx.Response]) -> RouterClient:
    def answer(request: httpx.Request) -> httpx.Response:
        return routes.get(request.url.path, httpx.Response(404, text="Not Found"))

    return RouterClient(fleet(kind), transport=httpx.MockTransport(answer))


def test_sglang_router_lists_its_workers_at_workers():
    router = client("sglang-router", {"/workers": httpx.Response(200, json=SGLANG_WORKERS)})
    assert router.workers() == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]


def test_vllm_router_lists_its_workers_at_list_workers():
    body = {"urls": ["http://a:8000/", "http://b:8000"]}
    router = client("vllm-router", {"/list_workers": httpx.Response(200, json=body)})
    assert router.workers() == ["http://a:8000", "http://b:8000"]


@pytest.mark.parametrize(
    ("kind", "routes"),
    [
        ("vllm-router", {"/workers": httpx.Response(200, json=SGLANG_WORKERS)}),  # an sglang
        ("sglang-router", {"/list_workers": httpx.Response(200, json={"urls": []})}),  # a vllm
        ("sglang-router", {"/workers": httpx.Response(200, json={"urls": []})}),
        ("sglang-router", {"/workers": httpx.Response(200, text="<html>")}),
    ],
)
def test_a_router_of_another_kind_is_refused_not_an_empty_fleet(kind, routes):
    with pytest.raises(RouterApiError, match=r"fleet f: http://router:30000/"):
        client(kind, routes).workers()


def test_a_router_that_does_not_answer_is_unavailable_not_refused():
    router = client("sglang-router", {"/workers": httpx.Response(503)})
    with pytest.raises(EngineUnavailableError):
        router.workers()


def test_each_kind_counts_its_requests_under_its_own_name():
    text = (
        "# TYPE smg_router_requests_total counter\n"
        'smg_router_requests_total{endpoint="chat"} 5\n'
        'smg_router_requests_total{endpoint="completions"} 2\n'
    )
    settings = fleet("sglang-router").model_copy(
        update={"router_metrics_url": "http://router:29000/metrics"}
    )
    answer = httpx.MockTransport(lambda r: httpx.Response(200, text=text))
    with RouterClient(settings, transport=answer) as router:
        assert router.requests_served() == 7.0
    assert router_kind("vllm-router").requests_counter == "vllm_router_requests_total"


def test_policies_are_those_of_the_kind():
    assert policy_problem("sglang-router", "cache_aware") is None
    assert "no policy 'kv_aware'" in (policy_problem("sglang-router", "kv_aware") or "")
    assert policy_problem("vllm-router", "kv_aware") is None


# --- chats read back from their rendering -------------------------------------------------

ROLES = st.sampled_from(["system", "user", "assistant"])
CONTENT = st.text(
    st.characters(blacklist_characters="<|>", blacklist_categories=("Cs",)), min_size=1,
    max_size=40,
)  # fmt: skip
MESSAGES = st.lists(st.fixed_dictionaries({"role": ROLES, "content": CONTENT}), min_size=1,
                    max_size=4)  # fmt: skip


def chatml(messages: list[dict[str, str]]) -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def llama3(messages: list[dict[str, str]]) -> str:
    return "<|begin_of_text|>" + "".join(
        f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>"
        for m in messages
    )


@given(MESSAGES, st.sampled_from([chatml, llama3]))
def test_a_rendered_chat_reads_back_into_its_messages(messages, render):
    assert chat_messages(render(messages)) == tuple(messages)


@given(MESSAGES, st.sampled_from([chatml, llama3]), st.data())
def test_a_rendered_chat_cut_anywhere_reads_back_into_a_prefix_of_it(messages, render, data):
    text = render(messages)
    cut = data.draw(st.integers(1, len(text)))
    read = chat_messages(text[:cut])
    if read is None:
        return  # cut inside the first header: nothing to read
    assert len(read) <= len(messages)
    assert list(read[:-1]) == messages[: len(read) - 1]
    last, full = read[-1], messages[len(read) - 1]
    assert last["role"] == full["role"] and full["content"].startswith(last["content"])


@pytest.mark.parametrize("text", ["plain text", "Template 1. <|im_start|>user\nx", ""])
def test_text_that_is_no_rendered_chat_is_none(text):
    assert chat_messages(text) is None


def test_a_chat_prefix_is_primed_as_its_chat_and_any_other_as_it_is():
    rendered = "<|im_start|>system\nYou are a billing agent.<|im_end|>\n<|im_start|>user\nInvoice "
    item = WarmItem("prefix", "k", "m", text=rendered, params={"add_special_tokens": False})
    sent = as_users_send(item)
    assert sent.text is None and sent.endpoint == "chat" and "add_special_tokens" not in sent.params
    assert sent.messages == ({"role": "system", "content": "You are a billing agent."},
                             {"role": "user", "content": "Invoice "})  # fmt: skip
    completion = WarmItem("prefix", "k2", "m", text=rendered)  # a completions user's own text
    assert as_users_send(completion) is completion
