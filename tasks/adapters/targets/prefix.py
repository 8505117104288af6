"""Prefix and shape targets: prime an engine with 1-token requests through its public API.

Priming cannot be undone (an engine has no "forget this prefix" call), so each request is
recorded as an irreversible effect before it is sent. Text prefixes that share model and
parameters go several to a request (``/v1/completions`` takes a list of prompts; at most
``WarmOptions.prompts_per_request``); chat prefixes go one per ``/v1/chat/completions`` request
so the engine's chat template renders them.

Verification costs one request per item where the engine reports
``usage.prompt_tokens_details.cached_tokens`` on the priming request itself (vLLM with
``--enable-prompt-tokens-details``, the simulator) and its ``/metrics`` count prefix-cache
lookups (``vllm:prefix_cache_queries_total`` > 0: the cache is on, and vLLM keeps every whole
block it computes): the prime stands for its item, and one ``GET /metrics`` per batch, which
costs the engine no prompt tokens, for the batch. Where the engine publishes no such count, one
sampled probe per batch — its last prefix, the one primed last, so the probe leaves the cache's
LRU order as it was — checks that the engine keeps what it computed (a prefix cache switched off
reports 0 there); only when the sample shows no cached tokens is every item probed. An engine
that reports nothing (llama.cpp, TGI) gets a probe per item, which must answer faster than its
prime by ``ttft_drop``. A probe of a group needs ``min_cached_share`` of its prompt tokens
cached, else each prompt is probed alone and needs cached tokens > 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

from pipeline.errors import PrewarmError
from pipeline.keys import canonical_json
from pipeline.planner.plan import WarmItem
from pipeline.wal import Effect
from tasks.adapters.engine_client import Completion
from tasks.adapters.targets.base import BatchContext, ItemResult


def irreversible(items: Sequence[WarmItem], ctx: BatchContext, op: str) -> None:
    """Record ``op`` on each item as an engine effect that cannot be undone (before it is done)."""
    seq = ctx.next_seq()
    ctx.record(
        [
            Effect(seq + i, "engine", op, item.key, False, item_key=item.key)
            for i, item in enumerate(items)
        ]
    )


def _groupable(item: WarmItem) -> bool:
    return item.kind == "prefix" and item.messages is None


def groups(items: Sequence[WarmItem], size: int) -> list[list[int]]:
    """Indices of ``items`` cut into request groups: runs of text prefixes with the same model
    and parameters (at most ``size`` each); every other item alone. Order is kept."""

    def signature(pair: tuple[int, WarmItem]) -> str:
        i, item = pair
        if not _groupable(item):
            return f"single:{i}"
        ids = "ids:" if item.token_ids is not None else ""  # token-id and text prompts never mix
        if not item.params:
            return f"{ids}a:{item.adapter}"
        return ids + canonical_json({"a": item.adapter, "p": dict(item.params)})

    out: list[list[int]] = []
    for _, run in groupby(enumerate(items), key=signature):
        indices = [i for i, _ in run]
        out.extend(indices[k : k + max(1, size)] for k in range(0, len(indices), max(1, size)))
    return out


def _send(items: list[WarmItem], ctx: BatchContext) -> Completion:
    first = items[0]
    if len(items) > 1:
        return ctx.engine.complete_many(items)
    max_tokens = int(first.params.get("max_tokens", 1)) if first.kind == "shape" else 1
    return ctx.engine.complete(first, max_tokens=max_tokens)


def apply(items: Sequence[WarmItem], ctx: BatchContext) -> list[ItemResult]:
    """Prime every prefix (and run every shape request) once, in plan order."""
    irreversible(items, ctx, "prime")
    results = [ItemResult(item.key, item.kind) for item in items]
    for group in groups(items, ctx.group_size):
        try:
            done = _send([items[i] for i in group], ctx)
        except PrewarmError as exc:
            for i in group:
                results[i].fail(str(exc))
            continue
        for i in group:
            results[i].prime = done
    return results


def _probe_fails(probe: Completion, prime: Completion, ctx: BatchContext, alone: bool) -> str:
    """Why a probe shows no warm cache ('' when it does)."""
    if probe.cached_tokens is not None:
        if alone:
            return "" if probe.cached_tokens > 0 else "probe: no cached tokens"
        share = probe.cached_tokens / max(1, probe.prompt_tokens)
        return "" if share >= ctx.options.min_cached_share else "probe: group under share"
    if probe.elapsed_s > prime.elapsed_s * (1 - ctx.options.ttft_drop):
        return "probe: no time-to-first-token drop"
    return ""


def _probe(indices: list[int], items: Sequence[WarmItem], results: Sequence[ItemResult],
           ctx: BatchContext) -> None:  # fmt: skip
    group = [items[i] for i in indices]
    prime = results[indices[0]].prime
    assert prime is not None  # only primed groups are probed
    try:
        probe = ctx.engine.complete_many(group) if len(group) > 1 else ctx.engine.complete(group[0])
    except PrewarmError as exc:
        for i in indices:
            results[i].fail(f"probe: {exc}")
        return
    why = _probe_fails(probe, prime, ctx, alone=len(group) == 1)
    if why and len(group) > 1:
        for i in indices:  # find out which prompts did not stick
            _probe([i], items, results, ctx)
    elif why:
        results[indices[0]].fail(why)


def verify(items: Sequence[WarmItem], results: Sequence[ItemResult], ctx: BatchContext) -> None:
    """Verify primed prefixes (shapes are done once they answered): by their prime where the
    engine reports cached tokens on it and its metrics show its prefix cache on; by one sampled
    probe where only the first holds; by a probe each otherwise."""
    live = [i for i, item in enumerate(items) if results[i].ok and item.kind == "prefix"]
    primed = [i for i in live if results[i].prime is not None]
    accounted = [i for i in primed if _accounted(results[i].prime)]
    if accounted and (ctx.engine.prefix_cache_queries() or 0) > 0:
        for i in accounted:
            results[i].verified_by = "prime"
    elif accounted:
        sample = accounted[-1]
        _probe([sample], items, results, ctx)
        for i in accounted:
            results[i].verified_by = "prime" if i != sample else "probe"
        if not results[sample].ok:  # the sample says the cache keeps nothing: probe them all
            for i in accounted[:-1]:
                _probe([i], items, results, ctx)
    for group in groups(items, ctx.group_size):
        rest = [i for i in group if i in primed and i not in accounted]
        if rest:
            _probe(rest, items, results, ctx)


def _accounted(prime: Completion | None) -> bool:
    """Whether the engine reported its cache accounting on the priming request."""
    return prime is not None and prime.cached_tokens is not None
