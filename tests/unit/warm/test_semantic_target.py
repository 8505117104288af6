"""The semantic gateway target against a mock semantic gateway (HTTPX's mock transport, and a
dict for the Redis its entries live in): warmed through the gateway, verified by its word (a
no-store repeat answered with the stored answer), probed with other intents' prompts, its entry
recorded for rollback and deleted by the undo."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx

from pipeline.planner.plan import WarmItem
from pipeline.wal import Effect
from tasks.adapters.gateway_client import CACHE_KEY_HEADER, GatewayClient
from tasks.adapters.targets import semantic as target
from tasks.adapters.targets import undo_for
from tasks.adapters.targets.base import BatchContext, WarmOptions
from tasks.settings import GatewaySettings

GATEWAY = GatewaySettings(name="edge", url="http://gateway.test", engine="e", key="sk-1",
                          cache="semantic", cache_url="redis://cache.test:6379/0")  # fmt: skip
INDEX = GATEWAY.semantic_index


def chat(text: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0}


class Entries:
    """The gateway's Redis: RedisVL hashes by key."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, str]] = {}

    def scan_iter(self, match: str, count: int = 0):
        return [k.encode() for k in self.hashes if k.startswith(match.rstrip("*"))]

    def hmget(self, key, fields):
        entry = self.hashes.get(key.decode() if isinstance(key, bytes) else key, {})
        return [entry.get(f, "").encode() if f in entry else None for f in fields]

    def delete(self, *keys: str) -> None:
        for key in keys:
            self.hashes.pop(key, None)


class MockSemanticGateway:
    """Answers from the entry whose prompt ``near`` says is close, else asks "the engine" and
    stores the answer unless the request says ``no-store``."""

    def __init__(self, entries: Entries, near: Callable[[str, str], bool]) -> None:
        self.entries, self.near = entries, near
        self.seen: list[dict] = []
        self.answers = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.seen.append(body)
        prompt = body["messages"][0]["content"]
        for entry in self.entries.hashes.values():
            if self.near(prompt, entry["prompt"]):
                answer_id = json.loads(entry["response"])["id"]
                return httpx.Response(200, json={"id": answer_id}, headers={CACHE_KEY_HEADER: "s"})
        self.answers += 1
        answer_id = f"chatcmpl-{self.answers}"
        if not (body.get("cache") or {}).get("no-store"):
            self.entries.hashes[f"{INDEX}:{self.answers}"] = {
                "prompt": prompt,
                "response": json.dumps({"id": answer_id}),
            }
        return httpx.Response(200, json={"id": answer_id})


def first_word(a: str, b: str) -> bool:
    return a.split()[0] == b.split()[0]


def batch(near=first_word) -> tuple[BatchContext, list[Effect], MockSemanticGateway, Entries]:
    entries = Entries()
    mock = MockSemanticGateway(entries, near)
    client = GatewayClient(GATEWAY, transport=httpx.MockTransport(mock))
    client.cache = entries  # type: ignore[assignment]  # the gateway's Redis, as a dict
    ctx = BatchContext(None, None, WarmOptions(), gateways={"edge": client},  # type: ignore[arg-type]  # no engine or store: a gateway batch uses neither
                       sleep=lambda s: None)  # fmt: skip
    recorded: list[Effect] = []
    ctx.record = recorded.extend  # type: ignore[method-assign]  # the WAL's records, kept here
    return ctx, recorded, mock, entries


def item(text: str, probes: tuple[str, ...] = ()) -> WarmItem:
    return WarmItem("intent", f"intent:edge:{text}", "m", messages=tuple(chat(text)["messages"]),
                    endpoint="chat", gateway="edge", request=chat(text),
                    probes=tuple(chat(p) for p in probes))  # fmt: skip


def test_an_intent_is_warmed_verified_by_the_gateway_and_its_entry_recorded_for_undo():
    ctx, recorded, mock, entries = batch()
    items = [item("refund window for orders?", probes=("shipping times?", "opening hours?"))]
    results = target.apply(items, ctx)
    target.verify(items, results, ctx)
    assert results[0].ok and results[0].verified_by == "gateway", results[0].detail
    assert list(entries.hashes) == [f"{INDEX}:1"]  # the warm-up's entry, and nothing else
    assert all((b.get("cache") or {}).get("no-store") for b in mock.seen[1:])
    assert [e.op for e in recorded] == ["intent:edge", "stored"]
    undo = recorded[1].undo
    assert undo == {"op": "semantic_delete", "gateway": "edge", "keys": [f"{INDEX}:1"],
                    "ages_out_s": None}  # fmt: skip
    undo_for(None, ctx.gateways)(recorded[1])  # type: ignore[arg-type]  # no engine needed
    assert entries.hashes == {}


def test_an_entry_that_answers_another_intents_probe_is_deleted_and_the_item_fails():
    ctx, _, _, entries = batch()
    items = [item("refund window for orders?", probes=("shipping times?", "refund a gift card?"))]
    results = target.apply(items, ctx)
    target.verify(items, results, ctx)
    assert not results[0].ok and "refund a gift card" in results[0].detail
    assert entries.hashes == {}


def test_a_warm_up_the_cache_already_answers_is_left_as_it_was():
    ctx, recorded, _, entries = batch()
    entries.hashes[f"{INDEX}:old"] = {"prompt": "refund policy?",
                                      "response": json.dumps({"id": "chatcmpl-old"})}  # fmt: skip
    items = [item("refund window for orders?")]
    results = target.apply(items, ctx)
    target.verify(items, results, ctx)
    assert results[0].ok and results[0].verified_by == "already cached"
    assert [e.op for e in recorded] == ["intent:edge"] and len(entries.hashes) == 1


def test_an_entry_never_served_back_fails_verification():
    ctx, _, _, _ = batch(near=lambda a, b: False)  # a gateway whose cache never answers
    items = [item("refund window for orders?")]
    results = target.apply(items, ctx)
    target.verify(items, results, ctx)
    assert not results[0].ok and "not served from the gateway's cache" in results[0].detail
