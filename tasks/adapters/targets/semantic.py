"""Semantic gateway target: an intent's representative stored by the gateway in its semantic cache.

The representative (``WarmItem.request``, as its client sent it) goes through the gateway; on a
miss the gateway asks the engine and stores the answer under its own embedding of the prompt,
in the scope of the request's parameters and the caller's key. Verification is the gateway's
word: the same request again, sent so that the gateway stores nothing of it (``no-store``),
must be answered from its cache (``x-litellm-cache-key``) with the very answer the warm-up
stored (its ``id``: an answer from the cache carries the id of the answer it stored).

Then the probe: the item's other-intent prompts (``WarmItem.probes``), sent with ``no-store``,
must not be answered with that entry. One that is fails the item, and its entry is deleted at
once: an entry that answers another intent's question is never left serving.

WAL: the intent (item, gateway) is recorded before the request; once the entry is found in the
gateway's Redis (the RedisVL hash under the index's name whose prompt is the representative's
and whose answer has that id), a second record carries its undo (delete that hash), so a
rolled-back batch removes what it added. An entry not found there ages out by the gateway's TTL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pipeline.errors import PrewarmError
from pipeline.intents.requests import semantic_text
from pipeline.planner.plan import WarmItem
from pipeline.wal import Effect
from tasks.adapters.gateway_client import GatewayAnswer, GatewayClient
from tasks.adapters.targets.base import BatchContext, ItemResult
from tasks.adapters.targets.gateway import send_each, undo_deleting

DELETE = "semantic_delete"
#: repeats of a request before its entry must answer it (LiteLLM stores an answer after
#: sending it, and embeds its prompt first: a repeat within milliseconds can still miss)
VERIFY_ATTEMPTS = 30
VERIFY_PAUSE_S = 0.1


def _keep_answer_id(result: ItemResult, answer: GatewayAnswer) -> None:
    result.value = answer.response_id


def apply(items: Sequence[WarmItem], ctx: BatchContext) -> list[ItemResult]:
    """Send each intent's representative through its gateway, the intent recorded first (one
    answered from the cache at once: an entry within the threshold was there already)."""
    return send_each(items, ctx, "intent", _keep_answer_id)


def verify(items: Sequence[WarmItem], results: Sequence[ItemResult], ctx: BatchContext) -> None:
    """Each stored entry answers its own request again, and none of its probes."""
    for item, result in zip(items, results, strict=True):
        if not result.ok or result.verified_by == "already cached":
            continue
        client = ctx.gateways[item.gateway or ""]
        if not _answers_again(item, result, client, ctx):
            continue
        _record_entry(item, result, client, ctx)
        _probe(item, result, client)


def _answers_again(
    item: WarmItem, result: ItemResult, client: GatewayClient, ctx: BatchContext
) -> bool:
    for _ in range(VERIFY_ATTEMPTS):
        try:
            answer = client.send(item.endpoint, item.request or {}, store=False)
        except PrewarmError as exc:
            result.fail(f"verify: {exc}")
            return False
        if answer.cache_key and answer.response_id == result.value:
            result.verified_by = "gateway"
            return True
        ctx.sleep(VERIFY_PAUSE_S)
    result.fail(f"verify: its answer not served from the gateway's cache after "
                f"{VERIFY_ATTEMPTS} repeats")  # fmt: skip
    return False


def _record_entry(
    item: WarmItem, result: ItemResult, client: GatewayClient, ctx: BatchContext
) -> None:
    """Find the entry in the gateway's Redis and record how to remove it."""
    text = semantic_text(item.endpoint, item.request or {})
    try:
        entry = client.semantic_entry(text or "", result.value or "")
    except PrewarmError as exc:
        result.detail = f"entry not found to undo ({exc}); it ages out by the gateway's TTL"
        return
    if entry is None:
        result.detail = "entry not found to undo; it ages out by the gateway's TTL"
        return
    result.gateway_key = entry
    undo = {
        "op": DELETE,
        "gateway": item.gateway,
        "keys": [entry],
        "ages_out_s": client.gateway.ttl_s,
    }
    ctx.record([Effect(ctx.next_seq(), "gateway", "stored", entry, True, None, undo,
                       item.key)])  # fmt: skip


def _probe(item: WarmItem, result: ItemResult, client: GatewayClient) -> None:
    """Other intents' prompts must not be answered with this entry."""
    others = 0
    for probe in item.probes or ():
        try:
            answer = client.send(item.endpoint, probe, store=False)
        except PrewarmError as exc:
            result.fail(f"probe: {exc}")
            return
        if answer.cache_key and answer.response_id == result.value:
            if result.gateway_key:
                client.delete_entries([result.gateway_key])
            text = semantic_text(item.endpoint, probe) or ""
            result.fail(f"probe: another intent's {text[:60]!r} was answered with this entry; "
                        "deleted")  # fmt: skip
            return
        others += bool(answer.cache_key)
    if others:
        result.detail = f"{others} probes answered by other entries"


def undo_for(clients: Mapping[str, GatewayClient]) -> Callable[[Effect], bool]:
    """The compensating call for this target's effects (True when it handled ``effect``)."""
    return undo_deleting(clients, DELETE, GatewayClient.delete_entries)
