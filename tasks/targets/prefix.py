"""Prefix and shape targets: prime an engine with 1-token requests through its public API.

Priming cannot be undone (an engine has no "forget this prefix" call), so each request is
recorded as an irreversible effect before it is sent. Verification probes the same prefix: it
must report ``usage.prompt_tokens_details.cached_tokens`` > 0, or — where the engine does not
report it — answer faster than the priming request by at least ``ttft_drop``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.errors import PrewarmError
from pipeline.plan import WarmItem
from pipeline.wal import Effect
from tasks.targets.base import BatchContext, ItemResult


def _irreversible(items: Sequence[WarmItem], ctx: BatchContext, op: str) -> None:
    seq = ctx.next_seq()
    ctx.record(
        [
            Effect(seq + i, "engine", op, item.key, False, item_key=item.key)
            for i, item in enumerate(items)
        ]
    )


def apply(items: Sequence[WarmItem], ctx: BatchContext) -> list[ItemResult]:
    """Prime every prefix (and run every shape request) once, in plan order."""
    _irreversible(items, ctx, "prime")
    results = []
    for item in items:
        result = ItemResult(item.key, item.kind)
        max_tokens = int(item.params.get("max_tokens", 1)) if item.kind == "shape" else 1
        try:
            result.prime = ctx.engine.complete(item, max_tokens=max_tokens)
        except PrewarmError as exc:
            result.fail(str(exc))
        results.append(result)
    return results


def verify(items: Sequence[WarmItem], results: Sequence[ItemResult], ctx: BatchContext) -> None:
    """Probe each primed prefix; shapes are done once they answered."""
    for item, result in zip(items, results, strict=True):
        if not result.ok or item.kind != "prefix" or result.prime is None:
            continue
        try:
            probe = ctx.engine.complete(item, max_tokens=1)
        except PrewarmError as exc:
            result.fail(f"probe: {exc}")
            continue
        if probe.cached_tokens is not None:
            if probe.cached_tokens <= 0:
                result.fail("probe: no cached tokens")
        elif probe.elapsed_s > result.prime.elapsed_s * (1 - ctx.options.ttft_drop):
            result.fail("probe: no time-to-first-token drop")
