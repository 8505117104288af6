"""Fleets: a router and its replicas, each replica an engine of the loop.

A fleet whose replicas are listed has them in its settings; one that takes them from its router
(or from a DNS name with an address per replica) has them as the router listed them (or the name
resolved) at the last look (kept in the store, so every process sees
the same replicas). :func:`fleet_settings` gives settings with every fleet's current replicas
as engines; :func:`look_at_fleets` asks each router for its workers (a replica that appears is
then new to the replica watch, which warms it at once; one that goes away is dropped), and
records each fleet, replica by replica, for ``/metrics``."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Collection
from typing import Any

from pipeline.errors import EngineUnavailableError
from pipeline.fleet_roads import ROUTER_RESTARTED, forgets_at_restart, road_note, road_of
from pipeline.triggers import TriggerEvent
from tasks.adapters import fleet_state
from tasks.adapters.connections import redacted
from tasks.adapters.cooldowns import cooldown_allows
from tasks.adapters.replica_dns import Resolver, replica_urls
from tasks.adapters.router_client import RouterClient
from tasks.adapters.store import Store
from tasks.adapters.telemetry import record_fleet
from tasks.services.replica_watch import WarmNow
from tasks.settings import Settings
from tasks.settings.fleets import FleetSettings

#: a client of a fleet's router (tests pass one with a mock transport)
RouterFor = Callable[[FleetSettings], RouterClient]


def _discovered(settings: Settings) -> list[str]:
    return [f.name for f in settings.fleets if f.discovered]


def fleet_settings(settings: Settings, store: Store) -> Settings:
    """``settings`` with every fleet's current replicas as engines (those a router lists: as it
    listed them at the last look)."""
    discovered = _discovered(settings)
    if not discovered:
        return settings
    return settings.with_members(fleet_state.members(store, discovered))


def look_at_fleets(
    settings: Settings,
    store: Store,
    router_for: RouterFor = RouterClient,
    now: float | None = None,
    resolve: Resolver = socket.getaddrinfo,
) -> tuple[Settings, list[dict[str, Any]]]:
    """One look at every fleet's router (and, for a fleet found by DNS, at its name): the
    current replicas of a fleet that does not list them are stored; returns the settings with
    the current replicas and what changed (replicas added or removed, a router that
    restarted)."""
    now = time.time() if now is None else now
    before = fleet_settings(settings, store)
    seen: dict[str, dict[str, Any]] = {}
    for fleet in settings.fleets:
        with router_for(fleet) as router:
            seen[fleet.name] = _look_at_router(store, fleet, router, now)
        if fleet.replicas_from == "dns":
            # (a name that does not resolve keeps the last look's replicas until it does)
            with contextlib.suppress(EngineUnavailableError):
                fleet_state.save_members(store, fleet.name, replica_urls(fleet, resolve))
    after = fleet_settings(settings, store)
    changes = [
        {"fleet": f.name, **seen[f.name], **_record(store, f, before, after, seen[f.name])}
        for f in settings.fleets
    ]
    return after, [c for c in changes if c["added"] or c["removed"] or c["router_restarted"]]


def _look_at_router(
    store: Store, fleet: FleetSettings, router: RouterClient, now: float
) -> dict[str, Any]:
    """Whether the router is up and restarted since the last look (found down then, or its
    request counters went back); its worker list is stored for a fleet that takes it."""
    up = router.is_up()
    if up and fleet.replicas_from == "router":
        # (a router that does not answer keeps its last list until it does)
        with contextlib.suppress(EngineUnavailableError):
            fleet_state.save_members(store, fleet.name, router.workers())
    served = router.requests_served() if up else None
    last = fleet_state.router_seen(store, fleet.name)
    restarted = (
        last is not None
        and up
        and (
            not last["up"]
            or (served is not None and last.get("served") is not None and served < last["served"])
        )
    )
    restarted_at = now if restarted else (last or {}).get("restarted_at")
    fleet_state.save_router_seen(
        store, fleet.name, {"up": up, "served": served, "ts": now, "restarted_at": restarted_at}
    )
    return {"router_up": up, "router_restarted": restarted}


def router_restart_warms(
    settings: Settings,
    store: Store,
    changes: list[dict[str, Any]],
    warm: WarmNow,
    now: float,
    warmed: Collection[str] = (),
) -> list[dict[str, Any]]:
    """A router that keeps a memory of where prefixes live (``cache_aware``, ``kv_aware``) and
    restarted has forgotten it: each replica of its fleet is warmed again, through the router
    (``warm`` with :data:`ROUTER_RESTARTED`), past its cooldown, unless it was just ``warmed``
    (a replica that restarted with it). Returns what fired."""
    fired = []
    for change in changes:
        fleet = settings.fleet(change["fleet"])
        if not change["router_restarted"] or not forgets_at_restart(fleet.policy):
            continue
        for engine in settings.replicas_of(fleet.name):
            if engine.name in warmed:
                continue
            event = TriggerEvent(ROUTER_RESTARTED, engine.name, now, {"fleet": fleet.name})
            if cooldown_allows(store, event):
                fired.append({**event.to_dict(), **warm(engine.name, event.kind)})
    return fired


def _record(
    store: Store, fleet: FleetSettings, before: Settings, after: Settings, seen: dict[str, Any]
) -> dict[str, Any]:
    road = road_of(fleet.policy).value
    old = {e.name for e in before.replicas_of(fleet.name)}
    now = {e.name for e in after.replicas_of(fleet.name)}
    record_fleet(
        store, fleet.name, {name: (fleet.policy, road) for name in now},
        [(name, fleet.policy, road) for name in sorted(old - now)], router_up=seen["router_up"],
        router_restarted=seen["router_restarted"],
    )  # fmt: skip
    return {"added": sorted(now - old), "removed": sorted(old - now)}


def fleet_status(settings: Settings, store: Store) -> list[dict[str, Any]]:
    """Each fleet for ``prewarm status``: its router, policy and road, and its replicas."""
    current = fleet_settings(settings, store)
    return [
        {
            "fleet": fleet.name,
            "router": fleet.router,
            "router_url": redacted(fleet.router_url),
            "policy": fleet.policy,
            "road": road_of(fleet.policy).value,
            "why": road_note(fleet.policy),
            "replicas_from": fleet.replicas_from,
            "router_seen": fleet_state.router_seen(store, fleet.name),
            "replicas": [
                {"engine": e.name, "url": redacted(e.url)} for e in current.replicas_of(fleet.name)
            ],
        }
        for fleet in settings.fleets
    ]
