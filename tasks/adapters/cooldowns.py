"""Trigger cooldowns in the store (``SET NX PX``): one claim per (kind, engine) and period, so
two watchers, two workers or a watcher and a worker cannot both fire the same trigger. Every
trigger passes here on its one road: event → cooldown → the "warm now" task."""

from __future__ import annotations

import redis

from pipeline.fleet_roads import ROUTER_RESTARTED
from pipeline.triggers import REPLICA_READY, REPLICA_RESTARTED, TriggerEvent
from tasks.adapters import redis_keys
from tasks.adapters.telemetry import record_trigger

#: A replica that became ready or restarted is warmed at most once per this many seconds.
REPLICA_COOLDOWN_S = 30.0
#: A cold-cache trigger (hit-rate drop, spike, drift) fires at most once per this many seconds.
TRIGGER_COOLDOWN_S = 300.0


def cooldown_s(kind: str) -> float:
    """The cooldown of a trigger kind: a replica's start-up, or any cold-cache trigger."""
    # (a restarted router forgets what it routed: its fleet is warmed again as a replica's is)
    replica_like = kind.startswith(("replica", "router"))
    return REPLICA_COOLDOWN_S if replica_like else TRIGGER_COOLDOWN_S


def cooldown_allows(store: redis.Redis, event: TriggerEvent, seconds: float | None = None) -> bool:
    """Claim the cooldown of ``event``'s kind and engine (``seconds``, by default its kind's);
    False while one is running."""
    period = cooldown_s(event.kind) if seconds is None else seconds
    key = redis_keys.TRIGGER_COOLDOWN.format(kind=event.kind, engine=event.engine)
    claimed = bool(store.set(key, str(event.ts), nx=True, px=max(1, int(period * 1000))))
    return record_trigger(store, event.engine, event.kind, claimed)


#: the trigger kinds whose cooldown a replica's warm-up holds
REPLICA_KINDS = (REPLICA_READY, REPLICA_RESTARTED, ROUTER_RESTARTED)


def release_cooldowns(
    store: redis.Redis, engine: str, kinds: tuple[str, ...] = REPLICA_KINDS
) -> None:
    """Free ``engine``'s cooldowns of ``kinds``: a warm-up that failed must not hold one (a
    restart inside it would otherwise go unwarmed)."""
    store.delete(*(redis_keys.TRIGGER_COOLDOWN.format(kind=k, engine=engine) for k in kinds))
