"""What makes prewarm not green, each problem with the time it was first seen, in the store.

A problem is a (kind, subject) pair — a fleet whose replicas cannot be found, a fleet's router
that does not answer, an engine whose last plan has items not verified — and a detail. Whoever
sees it marks it (:func:`mark`) with the time of its look; the first time is kept until the
problem goes (``detail`` None clears it), so ``prewarm status`` can say since when."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import redis

from tasks.adapters import redis_keys

#: a fleet that takes its replicas from its router (or DNS) and cannot read them, or reads none
UNDISCOVERABLE = "replicas_undiscoverable"
#: a fleet's router that does not answer ``/health``: the road through it fails
ROUTER_DOWN = "router_down"
#: the shared store (``data_dir``: a bucket) did not answer the engine's last tick; what it read
#: is kept in Redis until the store answers
SHARED_STORE_DOWN = "shared_store_unavailable"
#: an engine's last plan with items not verified (failed to warm, or not held where users land)
PLAN_UNVERIFIED = "plan_unverified"
#: a gated replica admitted cold at its deadline (cleared when a later episode is verified)
GATE_ADMITTED_COLD = "gate_admitted_cold"


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem: its kind, what it is about (a fleet or an engine), what is wrong, since."""

    kind: str
    subject: str
    detail: str
    since: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _field(kind: str, subject: str) -> str:
    return f"{kind}:{subject}"


def mark(
    store: redis.Redis, kind: str, subject: str, detail: str | None, now: float
) -> tuple[Problem | None, bool]:
    """Record ``subject``'s problem of ``kind`` as seen at ``now`` (``detail`` None: it is gone).
    Returns the problem (None when gone) and whether it changed (appeared, went, or its detail
    changed) — what a caller logs once instead of at every look."""
    field = _field(kind, subject)
    raw = store.hget(redis_keys.PROBLEMS, field)
    last = json.loads(raw) if raw else None
    if detail is None:
        if last is not None:
            store.hdel(redis_keys.PROBLEMS, field)
        return None, last is not None
    since = float(last["since"]) if last else now
    if last is None or last["detail"] != detail:
        store.hset(redis_keys.PROBLEMS, field, json.dumps({"since": since, "detail": detail}))
    return Problem(kind, subject, detail, since), last is None or last["detail"] != detail


def current(store: redis.Redis) -> list[Problem]:
    """Every problem recorded now, oldest first."""
    out = []
    for field, raw in store.hgetall(redis_keys.PROBLEMS).items():
        name = field.decode() if isinstance(field, bytes) else str(field)
        kind, _, subject = name.partition(":")
        data = json.loads(raw)
        out.append(Problem(kind, subject, data["detail"], float(data["since"])))
    return sorted(out, key=lambda p: (p.since, p.kind, p.subject))
