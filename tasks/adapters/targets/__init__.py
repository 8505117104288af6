"""Warm-up targets by item kind, and the batch step that runs them in plan order.

Consecutive items of one kind form a run; runs are applied in plan order (an engine's LRU keeps
what was primed last), then verified. Responses and embeddings are a gateway's
(:mod:`.gateway`), intents a semantic gateway's (:mod:`.semantic`). :func:`undo_for` gives the
compensating calls the WAL needs to roll a batch back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import groupby

from pipeline.planner.plan import WarmItem
from pipeline.wal import Effect
from tasks.adapters.engine_client import EngineClient
from tasks.adapters.gateway_client import GatewayClient
from tasks.adapters.targets import adapter, gateway, prefix, routed, semantic
from tasks.adapters.targets.base import BatchContext, ItemResult, WarmOptions

Apply = Callable[[Sequence[WarmItem], BatchContext], list[ItemResult]]
Verify = Callable[[Sequence[WarmItem], Sequence[ItemResult], BatchContext], None]


TARGETS: dict[str, tuple[Apply, Verify]] = {
    "prefix": (prefix.apply, prefix.verify),
    "shape": (prefix.apply, prefix.verify),
    "response": (gateway.apply, gateway.verify),
    "embedding": (gateway.apply, gateway.verify),
    "intent": (semantic.apply, semantic.verify),
    "adapter": (adapter.apply, adapter.verify),
}


#: prefixes and shapes of a fleet whose router remembers what it routed go through the router
ROUTED: dict[str, tuple[Apply, Verify]] = {
    "prefix": (routed.apply, routed.verify),
    "shape": (routed.apply, routed.verify),
}


def _target(kind: str, ctx: BatchContext) -> tuple[Apply, Verify]:
    if ctx.routed is not None and kind in ROUTED:
        return ROUTED[kind]
    return TARGETS[kind]


def runs(items: Sequence[WarmItem]) -> list[tuple[str, list[WarmItem]]]:
    """Items cut into runs of one kind, order kept."""
    return [(kind, list(group)) for kind, group in groupby(items, key=lambda i: i.kind)]


def apply_items(items: Sequence[WarmItem], ctx: BatchContext) -> list[ItemResult]:
    """Apply ``items`` run by run (each run records its effects before performing them)."""
    results: list[ItemResult] = []
    for kind, run in runs(items):
        results.extend(_target(kind, ctx)[0](run, ctx))
    return results


def verify_items(
    items: Sequence[WarmItem], results: Sequence[ItemResult], ctx: BatchContext
) -> None:
    """Verify applied items run by run; failures are marked on ``results``."""
    position = 0
    for kind, run in runs(items):
        _target(kind, ctx)[1](run, results[position : position + len(run)], ctx)
        position += len(run)


def undo_for(
    engine: EngineClient, gateways: Mapping[str, GatewayClient]
) -> Callable[[Effect], None]:
    """The compensating call of every target's effects: a gateway entry's delete, an adapter's
    unload."""
    gateway_undo, engine_undo = gateway.undo_for(gateways), adapter.undo_for(engine)
    semantic_undo = semantic.undo_for(gateways)

    def undo(effect: Effect) -> None:
        if not gateway_undo(effect) and not semantic_undo(effect):
            engine_undo(effect)

    return undo


__all__ = ["BatchContext", "ItemResult", "WarmOptions", "apply_items", "undo_for", "verify_items"]
