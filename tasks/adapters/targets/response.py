"""Response and embedding targets: values in the Redis cache under versioned keys.

A response is generated deterministically (temperature 0), gated on its mean token
log-probability, stored as JSON with a TTL, and before commit generated again: it must match.
An embedding is the engine's embedding of the prompt, stored for semantic lookups. Both are
Redis effects, so before-image, WAL record and write go in one ``MULTI``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from pipeline.errors import BadInputError, PrewarmError
from pipeline.keys import CacheKey, encode_value
from pipeline.planner.plan import WarmItem
from tasks.adapters.targets.base import BatchContext, ItemResult
from tasks.adapters.wal_store import RedisWrite


def _checked_key(item: WarmItem, result: ItemResult) -> str | None:
    try:
        return CacheKey.parse(item.key).render()
    except BadInputError as exc:
        result.fail(str(exc))
        return None


def _max_tokens(item: WarmItem, ctx: BatchContext) -> int:
    """The answer length the key was made for, else the options' default."""
    return int(item.params.get("max_tokens", ctx.options.response_max_tokens))


def _generate(item: WarmItem, result: ItemResult, ctx: BatchContext) -> None:
    options = ctx.options
    try:
        done = ctx.engine.complete(item, max_tokens=_max_tokens(item, ctx), logprobs=True)
    except PrewarmError as exc:
        result.fail(str(exc))
        return
    if done.mean_logprob is None or done.mean_logprob < options.min_mean_logprob:
        result.fail(f"confidence gate: mean logprob {done.mean_logprob}")
        return
    result.prime = done
    result.value = encode_value(
        {
            "text": done.text, "model": item.adapter or ctx.engine.engine.model,
            "mean_logprob": round(done.mean_logprob, 6), "created": round(time.time(), 3),
            "tenant": item.tenant, "item": item.key,
        }
    )  # fmt: skip


def apply(items: Sequence[WarmItem], ctx: BatchContext) -> list[ItemResult]:
    """Generate responses, then write them all (with their WAL records) in one step."""
    results = []
    for item in items:
        result = ItemResult(item.key, item.kind)
        result.redis_key = _checked_key(item, result)
        if result.ok:
            _generate(item, result, ctx)
        results.append(result)
    writes = [
        RedisWrite(r.redis_key, r.value, ctx.options.response_ttl_s, r.key)
        for r in results
        if r.ok and r.redis_key and r.value
    ]
    ctx.apply_redis(writes)
    return results


def verify(items: Sequence[WarmItem], results: Sequence[ItemResult], ctx: BatchContext) -> None:
    """Generate again: a deterministic response must come out the same."""
    for item, result in zip(items, results, strict=True):
        if not result.ok or result.prime is None:
            continue
        try:
            # The identical request: asking for log-probabilities must not change a greedy answer,
            # but an engine may differ there (the simulator does), so compare like with like.
            again = ctx.engine.complete(item, max_tokens=_max_tokens(item, ctx), logprobs=True)
        except PrewarmError as exc:
            result.fail(f"re-check: {exc}")
            continue
        if again.text != result.prime.text:
            result.fail("re-check: response is not deterministic")


def apply_embeddings(items: Sequence[WarmItem], ctx: BatchContext) -> list[ItemResult]:
    """Embed every prompt in one engine call and store the vectors."""
    results = [ItemResult(item.key, item.kind) for item in items]
    for item, result in zip(items, results, strict=True):
        result.redis_key = _checked_key(item, result)
    todo = [(i, r) for i, r in zip(items, results, strict=True) if r.ok]
    try:
        vectors = ctx.engine.embed([_text(i) for i, _ in todo]) if todo else []
    except PrewarmError as exc:
        for _, result in todo:
            result.fail(str(exc))
        return results
    for (item, result), vector in zip(todo, vectors, strict=True):
        result.value = encode_value({"vector": vector, "text": _text(item), "item": item.key})
    writes = [RedisWrite(r.redis_key, r.value, ctx.options.response_ttl_s, r.key)
              for _, r in todo if r.redis_key and r.value]  # fmt: skip
    ctx.apply_redis(writes)
    return results


def _text(item: WarmItem) -> str:
    if item.text is not None:
        return item.text
    return "\n".join(m.get("content", "") for m in item.messages or ())
