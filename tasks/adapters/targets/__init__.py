"""Warm-up targets by item kind, and the batch step that runs them in plan order.

Consecutive items of one kind form a run; runs are applied in plan order (an engine's LRU keeps
what was primed last), then verified. ``undo_for`` gives the compensating engine calls the WAL
needs to roll a batch back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import groupby

from pipeline.planner.plan import WarmItem
from tasks.adapters.targets import adapter, prefix, response
from tasks.adapters.targets.base import BatchContext, ItemResult, WarmOptions

Apply = Callable[[Sequence[WarmItem], BatchContext], list[ItemResult]]
Verify = Callable[[Sequence[WarmItem], Sequence[ItemResult], BatchContext], None]


def _no_check(items: Sequence[WarmItem], results: Sequence[ItemResult], ctx: BatchContext) -> None:
    """Embeddings are stored as returned; there is nothing to re-check cheaply."""


TARGETS: dict[str, tuple[Apply, Verify]] = {
    "prefix": (prefix.apply, prefix.verify),
    "shape": (prefix.apply, prefix.verify),
    "response": (response.apply, response.verify),
    "embedding": (response.apply_embeddings, _no_check),
    "adapter": (adapter.apply, adapter.verify),
}


def runs(items: Sequence[WarmItem]) -> list[tuple[str, list[WarmItem]]]:
    """Items cut into runs of one kind, order kept."""
    return [(kind, list(group)) for kind, group in groupby(items, key=lambda i: i.kind)]


def apply_items(items: Sequence[WarmItem], ctx: BatchContext) -> list[ItemResult]:
    """Apply ``items`` run by run (each run records its effects before performing them)."""
    results: list[ItemResult] = []
    for kind, run in runs(items):
        results.extend(TARGETS[kind][0](run, ctx))
    return results


def verify_items(
    items: Sequence[WarmItem], results: Sequence[ItemResult], ctx: BatchContext
) -> None:
    """Verify applied items run by run; failures are marked on ``results``."""
    position = 0
    for kind, run in runs(items):
        TARGETS[kind][1](run, results[position : position + len(run)], ctx)
        position += len(run)


__all__ = ["BatchContext", "ItemResult", "WarmOptions", "apply_items", "verify_items"]
