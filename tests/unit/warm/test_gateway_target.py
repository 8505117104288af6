"""The gateway target against a mock gateway (HTTPX's mock transport): warmed through the
gateway, verified by its word, its entries' undo recorded and run through ``/cache/delete``."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from pipeline.gateway_log import LOG_TAG
from pipeline.planner.gateway import HeadChange, changed_template_items, gateway_items
from pipeline.records import records_frame
from pipeline.wal import Effect
from tasks.adapters.gateway_client import CACHE_KEY_HEADER, GatewayClient, GatewayLog
from tasks.adapters.targets import gateway as target
from tasks.adapters.targets.base import BatchContext, WarmOptions
from tasks.settings import GatewaySettings

GATEWAY = GatewaySettings(name="edge", url="http://gateway.test", engine="e", key="sk-1")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Refund window?"}],
        "temperature": 0, "max_tokens": 8}  # fmt: skip


class MockGateway:
    """A gateway that stores an answer after ``store_after`` requests of it, and logs."""

    def __init__(self, log: Path | None = None, store_after: int = 1, caches: bool = True):
        self.seen: list[tuple[str, dict, dict]] = []
        self.cached: set[str] = set()
        self.log, self.store_after, self.caches = log, store_after, caches

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.seen.append((request.url.path, body, dict(request.headers)))
        if request.url.path == "/cache/delete":
            self.cached -= set(body["keys"])
            return httpx.Response(200, json={"status": "success"})
        key = "gw:" + json.dumps(body)  # (the gateway's own key: opaque to prewarm)
        hit = key in self.cached
        asked = sum(1 for path, b, _ in self.seen if b == body)
        if self.caches and asked >= self.store_after:
            self.cached.add(key)
        if self.log is not None:
            line = {"log": LOG_TAG, "request_id": request.headers["x-request-id"],
                    "cache_hit": hit}  # fmt: skip
            with self.log.open("a") as handle:
                handle.write(json.dumps(line) + "\n")
        headers = {CACHE_KEY_HEADER: key} if hit and "messages" in body else {}
        return httpx.Response(200, json={"choices": []}, headers=headers)


def _ctx(mock: MockGateway, log: Path | None = None) -> tuple[BatchContext, list[Effect]]:
    client = GatewayClient(GATEWAY, transport=httpx.MockTransport(mock))
    ctx = BatchContext(None, None, WarmOptions(), gateways={"edge": client},  # type: ignore[arg-type]  # no engine or store: a gateway batch uses neither
                       gateway_logs={"edge": GatewayLog([log] if log else [])},
                       sleep=lambda s: None)  # fmt: skip
    recorded: list[Effect] = []
    ctx.record = recorded.extend  # type: ignore[method-assign]  # the WAL's records, kept here
    return ctx, recorded


def _items(bodies: list[tuple[str, dict]], uses: int = 2):
    rows = [{"ts": "2026-01-01T00:00:00Z", "source": "gateway", "endpoint": endpoint,
             "request_body": json.dumps(body), "request_id": f"r{n}-{i}"}
            for i, (endpoint, body) in enumerate(bodies) for n in range(uses)]  # fmt: skip
    return gateway_items(records_frame(rows), "edge")


def test_a_response_is_sent_as_clients_send_it_and_verified_by_the_gateway():
    mock = MockGateway(store_after=2)  # the gateway stores on the second ask (a late write)
    ctx, recorded = _ctx(mock)
    [item] = _items([("chat", CHAT)])
    results = target.apply([item], ctx)
    target.verify([item], results, ctx)
    [result] = results
    assert result.ok and result.verified_by == "gateway", result.detail
    assert [path for path, _, _ in mock.seen] == ["/v1/chat/completions"] * 3
    assert all(body == CHAT for _, body, _ in mock.seen)  # exactly the clients' request
    assert all(h["authorization"] == "Bearer sk-1" for _, _, h in mock.seen)
    assert all(h["x-request-id"].startswith("prewarm-") for _, _, h in mock.seen)
    intent, stored = recorded
    assert intent.op == "request:edge" and not intent.reversible and intent.key == item.key
    assert stored.key == result.gateway_key and stored.undo["keys"] == [result.gateway_key]
    # a rollback deletes the entry through the gateway
    assert target.undo_for(ctx.gateways)(stored) is True
    assert mock.seen[-1][0] == "/cache/delete" and not mock.cached


def test_an_entry_already_cached_is_left_as_it_was():
    mock = MockGateway()
    mock.cached.add("gw:" + json.dumps(CHAT))
    ctx, recorded = _ctx(mock)
    [item] = _items([("chat", CHAT)])
    results = target.apply([item], ctx)
    target.verify([item], results, ctx)
    assert results[0].ok and results[0].verified_by == "already cached"
    assert len(mock.seen) == 1 and [e.undo for e in recorded] == [None]  # nothing to undo


def test_a_gateway_that_never_answers_from_its_cache_fails_the_item():
    mock = MockGateway(caches=False)
    ctx, recorded = _ctx(mock)
    [item] = _items([("chat", CHAT)])
    results = target.apply([item], ctx)
    target.verify([item], results, ctx)
    assert not results[0].ok and "not answered from the gateway's cache" in results[0].detail
    assert len(mock.seen) == 1 + target.VERIFY_ATTEMPTS and len(recorded) == 1


def test_embeddings_are_verified_by_the_gateways_log(tmp_path):
    log = tmp_path / "litellm.jsonl"
    mock = MockGateway(log=log)
    ctx, _ = _ctx(mock, log)
    items = _items([("embeddings", {"model": "emb", "input": ["alpha", "beta"]})])
    assert sorted(i.request["input"][0] for i in items) == ["alpha", "beta"]
    results = target.apply(items, ctx)
    target.verify(items, results, ctx)
    assert all(r.ok and r.verified_by == "gateway" for r in results), results
    # a gateway whose log never shows the hit: the items fail
    silent = MockGateway(log=tmp_path / "other.jsonl", caches=False)
    ctx, _ = _ctx(silent, tmp_path / "other.jsonl")
    results = target.apply(items, ctx)
    target.verify(items, results, ctx)
    assert not any(r.ok for r in results)


def test_a_changed_head_gives_the_new_renderings_of_what_clients_repeat():
    old, new = "You are the billing assistant. Be brief. ", "You are the billing assistant. "
    change = HeadChange(old, new, "billing@2")

    def chat(system: str) -> dict:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": "Why?"}]
        return {"model": "m", "temperature": 0, "messages": messages}

    bodies = [
        ("chat", chat(old + "Customer: Bob")),
        ("chat", chat("Translate: " + "x" * 200)),
        ("completions", {"model": "m", "prompt": old + "Q: refund?", "temperature": 0}),
        ("chat", chat("Preamble " * 20 + old)),  # the head far from the start: not the template
    ]
    rows = [
        {"ts": "2026-01-01T00:00:00Z", "endpoint": e, "request_body": json.dumps(b),
         "request_id": f"r{n}-{i}"}
        for i, (e, b) in enumerate(bodies) for n in range(2)
    ]  # fmt: skip
    items = changed_template_items(records_frame(rows), "edge", [change])
    rendered = sorted(json.dumps(i.request) for i in items)
    assert rendered == sorted([json.dumps(chat(new + "Customer: Bob")),
                               json.dumps({"model": "m", "prompt": new + "Q: refund?",
                                           "temperature": 0})])  # fmt: skip
    assert {i.template for i in items} == {"billing@2"} and all(i.gateway == "edge" for i in items)
    # asked once: not frequent, nothing to warm
    assert changed_template_items(records_frame(rows[::2]), "edge", [change]) == []


def test_a_key_outside_the_configured_namespace_fails_naming_both():
    mock = MockGateway()
    ctx, recorded = _ctx(mock)
    other = GatewaySettings(name="edge", url="http://gateway.test", engine="e", namespace="prod")
    ctx.gateways["edge"] = GatewayClient(other, transport=httpx.MockTransport(mock))
    [item] = _items([("chat", CHAT)])
    results = target.apply([item], ctx)
    target.verify([item], results, ctx)
    assert not results[0].ok and "outside namespace 'prod'" in results[0].detail
    assert [e.undo for e in recorded] == [None]  # nothing recorded as the gateway's entry
