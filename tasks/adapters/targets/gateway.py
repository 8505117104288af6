"""Gateway target: responses and embeddings warmed into a gateway's own cache, by the gateway.

Each item's request (``WarmItem.request``, as its clients send it) goes through the gateway;
on a miss the gateway asks the engine and stores its answer under its own key. Verification
is the gateway's word: the same request again must be answered from its cache (the
``x-litellm-cache-key`` header, or for embeddings the ``cache_hit`` of its line in the
gateway's request log), and, with the gateway's ``cache_url`` configured, the entry it names
must be in its Redis (LiteLLM answers from its process's memory first). An entry that was
already there is left as it was.

WAL: the intent (item, gateway) is recorded before the request; once the gateway names the
key it stored, a second record carries the undo (delete that key through the gateway's
``/cache/delete``), so a rolled-back batch removes what it added. An entry whose key was never
named (the batch died before verifying) ages out by the gateway's TTL.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pipeline.errors import PrewarmError
from pipeline.planner.plan import WarmItem
from pipeline.wal import Effect
from tasks.adapters.gateway_client import GatewayAnswer, GatewayClient, wait_for_hits
from tasks.adapters.targets.base import BatchContext, ItemResult

DELETE = "gateway_delete"
#: repeats of a request before its entry must be in the gateway's cache (LiteLLM stores an
#: answer after sending it: a repeat within milliseconds can still miss)
VERIFY_ATTEMPTS = 20
VERIFY_PAUSE_S = 0.1


def _client(item: WarmItem, ctx: BatchContext, result: ItemResult) -> GatewayClient | None:
    client = ctx.gateways.get(item.gateway or "")
    if client is None or item.request is None:
        result.fail(f"gateway {item.gateway!r} is not configured or the item has no request")
    return client


def send_recorded(
    item: WarmItem, ctx: BatchContext, result: ItemResult, what: str
) -> GatewayAnswer | None:
    """Send ``item``'s request through its gateway, the WAL intent (``what:<gateway>``)
    recorded first; None when it could not be sent (``result`` says why). An answer from the
    cache at once marks the item ``already cached``: the entry was there before, not prewarm's."""
    client = _client(item, ctx, result)
    if client is None or item.request is None:
        return None
    ctx.record([Effect(ctx.next_seq(), "gateway", f"{what}:{client.gateway.name}",
                       item.key, False, None, None, item.key)])  # fmt: skip
    try:
        answer = client.send(item.endpoint, item.request)
    except PrewarmError as exc:
        result.fail(str(exc))
        return None
    result.verified_by = "already cached" if answer.cache_key else ""
    return answer


def send_each(
    items: Sequence[WarmItem], ctx: BatchContext, what: str,
    keep: Callable[[ItemResult, GatewayAnswer], None],
) -> list[ItemResult]:  # fmt: skip
    """:func:`send_recorded` for every item, ``keep`` taking what each answer leaves to undo
    or verify."""
    results = []
    for item in items:
        result = ItemResult(item.key, item.kind)
        results.append(result)
        answer = send_recorded(item, ctx, result, what)
        if answer is not None:
            keep(result, answer)
    return results


def _keep_cache_key(result: ItemResult, answer: GatewayAnswer) -> None:
    result.gateway_key = answer.cache_key


def apply(items: Sequence[WarmItem], ctx: BatchContext) -> list[ItemResult]:
    """Send each item's request through its gateway, the intent recorded first."""
    return send_each(items, ctx, "request", _keep_cache_key)


def verify(items: Sequence[WarmItem], results: Sequence[ItemResult], ctx: BatchContext) -> None:
    """Every item's request is now answered from the gateway's cache (see the module doc)."""
    pending = [(i, r) for i, r in zip(items, results, strict=True)
               if r.ok and r.verified_by != "already cached"]  # fmt: skip
    chats = [(i, r) for i, r in pending if i.kind == "response"]
    embeddings = [(i, r) for i, r in pending if i.kind == "embedding"]
    for item, result in chats:
        _verify_response(item, result, ctx)
    if embeddings:
        _verify_embeddings(embeddings, ctx)


def _verify_response(item: WarmItem, result: ItemResult, ctx: BatchContext) -> None:
    client = ctx.gateways[item.gateway or ""]
    for _ in range(VERIFY_ATTEMPTS):
        try:
            answer = client.send(item.endpoint, item.request or {})
        except PrewarmError as exc:
            result.fail(f"verify: {exc}")
            return
        if answer.cache_key and not _in_namespace(client, answer.cache_key):
            namespace = client.gateway.namespace
            result.fail(f"verify: the gateway named {answer.cache_key!r}, outside namespace "
                        f"{namespace!r}: its cache_params and [[gateways]] differ")  # fmt: skip
            return
        if answer.cache_key and _in_redis(client, answer.cache_key):
            _stored(item, result, ctx, answer)
            return
        ctx.sleep(VERIFY_PAUSE_S)
    result.fail(f"verify: not answered from the gateway's cache after {VERIFY_ATTEMPTS} repeats")


def _in_namespace(client: GatewayClient, key: str) -> bool:
    namespace = client.gateway.namespace
    return not namespace or key.startswith(f"{namespace}:")


def _in_redis(client: GatewayClient, key: str) -> bool:
    """Whether the entry the gateway named is in the Redis it caches in (True when no
    ``cache_url`` is configured: the header is then the only word there is)."""
    return client.cache is None or client.stored_ttl_s(key) is not None


def _verify_embeddings(pairs: Sequence[tuple[WarmItem, ItemResult]], ctx: BatchContext) -> None:
    for _ in range(VERIFY_ATTEMPTS):
        answers: dict[str, tuple[WarmItem, ItemResult, GatewayAnswer]] = {}
        for item, result in pairs:
            try:
                answer = ctx.gateways[item.gateway or ""].send(item.endpoint, item.request or {})
            except PrewarmError as exc:
                result.fail(f"verify: {exc}")
                continue
            answers[answer.request_id] = (item, result, answer)
        hits = wait_for_hits(ctx.gateway_log(pairs[0][0].gateway or ""), list(answers))
        pairs = [(i, r) for rid, (i, r, a) in answers.items() if not hits.get(rid)]
        for rid, (item, result, answer) in answers.items():
            if hits.get(rid):
                _stored(item, result, ctx, answer)
        if not pairs:
            return
        ctx.sleep(VERIFY_PAUSE_S)
    for _, result in pairs:
        result.fail("verify: the gateway's log shows no cache hit for the repeat")


def _stored(item: WarmItem, result: ItemResult, ctx: BatchContext, answer: GatewayAnswer) -> None:
    """The gateway answered from its cache: record what it stored and how to remove it."""
    result.verified_by = "gateway"
    result.gateway_key = answer.cache_key
    if answer.cache_key:
        client = ctx.gateways[item.gateway or ""]
        # when it ages out by the gateway's TTL, where no rollback deletes it
        left = client.stored_ttl_s(answer.cache_key) if client.cache else client.gateway.ttl_s
        undo = {"op": DELETE, "gateway": item.gateway, "keys": [answer.cache_key],
                "ages_out_s": left}  # fmt: skip
        ctx.record([Effect(ctx.next_seq(), "gateway", "stored", answer.cache_key, True, None,
                           undo, item.key)])  # fmt: skip


def undo_deleting(
    clients: Mapping[str, GatewayClient], op: str,
    delete: Callable[[GatewayClient, list[str]], object],
) -> Callable[[Effect], bool]:  # fmt: skip
    """The compensating call of effects whose undo is ``op``: ``delete`` the keys it names from
    its gateway (True when it handled the effect)."""

    def undo(effect: Effect) -> bool:
        spec = effect.undo or {}
        if spec.get("op") != op:
            return False
        client = clients.get(str(spec.get("gateway")))
        if client is not None:
            delete(client, [str(k) for k in spec.get("keys") or ()])
        return True

    return undo


def undo_for(clients: Mapping[str, GatewayClient]) -> Callable[[Effect], bool]:
    """The compensating call for this target's effects (True when it handled ``effect``)."""
    return undo_deleting(clients, DELETE, GatewayClient.delete)
