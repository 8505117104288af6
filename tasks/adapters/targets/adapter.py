"""Adapter target: load a LoRA adapter with ``/v1/load_lora_adapter``; undo unloads it.

Only adapters configured for the engine (``EngineSettings.adapters``, ``name`` or
``name=path``) may be loaded — a plan names an adapter, never a path. An adapter that is already
loaded is left alone and gets no undo, so a rollback never unloads what was there before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from pipeline.errors import PrewarmError
from pipeline.planner.plan import WarmItem
from pipeline.wal import Effect
from tasks.adapters.engine_client import EngineClient
from tasks.adapters.targets.base import BatchContext, ItemResult

UNLOAD = "unload_adapter"


def adapter_paths(configured: Sequence[str]) -> dict[str, str]:
    """``name`` -> path from ``EngineSettings.adapters`` entries (``name`` or ``name=path``)."""
    paths = {}
    for entry in configured:
        name, _, path = entry.partition("=")
        paths[name.strip()] = (path or name).strip()
    return paths


def _name(item: WarmItem) -> str:
    # An item may carry a configured entry as is ("name=path"): the name is what is loaded.
    return (item.adapter or item.key).partition("=")[0].strip()


def apply(items: Sequence[WarmItem], ctx: BatchContext) -> list[ItemResult]:
    """Load each configured adapter that is not loaded yet, recording the undo first."""
    results = []
    try:
        loaded = ctx.engine.loaded_models()
    except PrewarmError as exc:
        return [ItemResult(i.key, i.kind, False, str(exc)) for i in items]
    for item in items:
        result, name = ItemResult(item.key, item.kind), _name(item)
        results.append(result)
        if name not in ctx.adapter_paths:
            result.fail(f"adapter {name!r} is not configured for this engine")
        elif name not in loaded:
            _load(ctx, item, name, result)
            loaded.add(name)
    return results


def _load(ctx: BatchContext, item: WarmItem, name: str, result: ItemResult) -> None:
    undo = {"op": UNLOAD, "name": name}
    ctx.record([Effect(ctx.next_seq(), "engine", "load_adapter", name, True, None, undo, item.key)])
    try:
        ctx.engine.load_adapter(name, ctx.adapter_paths[name])
    except PrewarmError as exc:
        result.fail(str(exc))


def verify(items: Sequence[WarmItem], results: Sequence[ItemResult], ctx: BatchContext) -> None:
    """Every adapter that was to be loaded is listed by the engine."""
    try:
        loaded = ctx.engine.loaded_models()
    except PrewarmError as exc:
        for result in results:
            result.fail(f"verify: {exc}")
        return
    for item, result in zip(items, results, strict=True):
        if result.ok and _name(item) not in loaded:
            result.fail("verify: adapter not listed by the engine")


def undo_for(engine: EngineClient) -> Callable[[Effect], None]:
    """The compensating call for this target's engine effects."""

    def undo(effect: Effect) -> None:
        spec: Mapping[str, str] = effect.undo or {}
        if spec.get("op") == UNLOAD:
            engine.unload_adapter(spec["name"])

    return undo
