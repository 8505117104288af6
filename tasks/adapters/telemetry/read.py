"""The read side: the series for the api's scrape, an engine's history for the report, what was
warmed and planned for the loop's window outcome, and a plan's labels for its batches."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, cast

import redis

from pipeline.window_outcome import WarmState
from tasks.adapters.telemetry.specs import (
    SERIES,
    SPECS,
    engine_key,
    history_key,
    plan_key,
    planned_key,
    series_field,
    text,
    warmed_key,
)

#: Labels of the plans this process ran batches of (a plan's labels never change), so a batch
#: costs no round trip of its own for them. Bounded: the oldest entries go first.
_PLAN_LABELS: dict[str, tuple[str, str]] = {}
_PLAN_LABELS_MAX = 1024


def plan_labels(store: redis.Redis, plan_id: str, engine: str) -> tuple[str, str]:
    """(engine, reason) of a submitted plan, as :func:`record_plan` stored them; read once per
    plan and process."""
    known = _PLAN_LABELS.get(plan_id)
    if known is not None:
        return known
    raw = store.get(plan_key(plan_id))
    if not raw:
        return engine, "cli"  # a plan stored without submit (a re-warm's own batch)
    stored_engine, _, reason = text(raw).partition("\t")
    labels = (stored_engine or engine, reason or "cli")
    if len(_PLAN_LABELS) >= _PLAN_LABELS_MAX:
        del _PLAN_LABELS[next(iter(_PLAN_LABELS))]
    _PLAN_LABELS[plan_id] = labels
    return labels


def parse_series(raw: Mapping[Any, Any]) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """The ``series`` hash (as HGETALL returns it) by metric name: (label values, value).

    Fields of metrics this version does not know (an older or newer worker's) are skipped.
    """
    out: dict[str, list[tuple[tuple[str, ...], float]]] = {}
    for field, value in raw.items():
        name, labels = json.loads(field)
        if name in SPECS and len(labels) == SPECS[name].stored_labels:
            out.setdefault(name, []).append((tuple(labels), float(value)))
    return out


def read_series(store: redis.Redis) -> dict[str, list[tuple[tuple[str, ...], float]]]:
    """Every stored series by metric name."""
    return parse_series(cast(Mapping[Any, Any], store.hgetall(SERIES)))


def history(
    store: redis.Redis, engine: str, since: float = 0.0, until: float | None = None
) -> list[dict[str, Any]]:
    """The engine's events between ``since`` and ``until``, oldest first."""
    high: float | str = "+inf" if until is None else until
    rows = cast(list[bytes], store.zrangebyscore(history_key(engine), since, high))
    return [json.loads(raw) for raw in rows]


def engines_with_history(store: redis.Redis) -> list[str]:
    """Engines that have recorded history."""
    prefix = history_key("")
    return sorted(text(k)[len(prefix) :] for k in store.scan_iter(match=prefix + "*", count=1000))


def warm_state(store: redis.Redis, engine: str) -> WarmState:
    """What prewarm warmed and planned for ``engine``, and when the engine last restarted."""
    with store.pipeline(transaction=False) as pipe:
        pipe.hgetall(warmed_key(engine))
        pipe.hkeys(planned_key(engine))
        pipe.hget(engine_key(engine), "last_dropped")
        pipe.hget(SERIES, series_field("prewarm_engine_start_time_seconds", (engine,)))
        warmed, planned, dropped, start = pipe.execute()
    return WarmState(
        warmed_at=_warmed_at(warmed.values()),
        planned=frozenset(text(k) for k in planned),
        budget_cut=bool(dropped and int(float(dropped)) > 0),
        restarted_at=float(start) if start else None,
    )


def _warmed_at(batches: Iterable[Any]) -> dict[str, float]:
    """Item key -> when a committed batch last warmed it, from the ``warmed`` hash's values."""
    warmed_at: dict[str, float] = {}
    for raw in batches:
        ts, keys = json.loads(raw)
        for key in keys:
            warmed_at[key] = max(ts, warmed_at.get(key, ts))
    return warmed_at
