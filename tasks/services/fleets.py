"""Fleets: a router and its replicas, each replica an engine of the loop.

A fleet whose replicas are listed has them in its settings; one that takes them from its router
(or from a DNS name with an address per replica) has them as the router listed them (or the name
resolved) at the last look (kept in the store, so every process sees
the same replicas). :func:`fleet_settings` gives settings with every fleet's current replicas
as engines; :func:`look_at_fleets` asks each router for its workers (a replica that appears is
then new to the replica watch, which warms it at once; one that goes away is dropped), and
records each fleet, replica by replica, for ``/metrics``."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Collection
from typing import Any

from pipeline.errors import BadInputError, EngineUnavailableError
from pipeline.fleet_roads import ROUTER_RESTARTED, forgets_at_restart, road_note, road_of
from pipeline.triggers import TriggerEvent
from tasks.adapters import fleet_state, problems
from tasks.adapters.connections import redacted
from tasks.adapters.cooldowns import cooldown_allows
from tasks.adapters.replica_dns import Resolver, replica_urls
from tasks.adapters.router_client import RouterClient
from tasks.adapters.store import Store
from tasks.adapters.telemetry import record_fleet, record_road_retries
from tasks.services.replica_watch import WarmNow
from tasks.settings import Settings
from tasks.settings.fleets import FleetSettings

logger = logging.getLogger(__name__)

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
    restarted). A router that does not answer, or replicas that cannot be found, are marked
    as problems (:mod:`tasks.adapters.problems`) until they are not."""
    now = time.time() if now is None else now
    before = fleet_settings(settings, store)
    seen: dict[str, dict[str, Any]] = {}
    for fleet in settings.fleets:
        with router_for(fleet) as router:
            seen[fleet.name] = _look_at_router(store, fleet, router, now)
        if fleet.replicas_from == "dns":
            seen[fleet.name]["discovery_error"] = _resolve_replicas(store, fleet, resolve)
        _mark_problems(store, fleet, seen[fleet.name], now)
    after = fleet_settings(settings, store)
    changes = [
        {"fleet": f.name, **_change(seen[f.name]), **_record(store, f, before, after, seen[f.name])}
        for f in settings.fleets
    ]
    return after, [c for c in changes if c["added"] or c["removed"] or c["router_restarted"]]


def _change(seen: dict[str, Any]) -> dict[str, Any]:
    return {"router_up": seen["router_up"], "router_restarted": seen["router_restarted"]}


def _resolve_replicas(store: Store, fleet: FleetSettings, resolve: Resolver) -> str | None:
    """Store the replicas ``fleet``'s DNS name resolves to; returns why none were found (a
    name that does not resolve keeps the last look's replicas until it does)."""
    try:
        urls = replica_urls(fleet, resolve)
    except EngineUnavailableError as exc:
        return str(exc)
    if not urls:
        return f"fleet {fleet.name}: {fleet.replicas_dns} resolves to no address"
    fleet_state.save_members(store, fleet.name, urls)
    return None


def _read_workers(store: Store, fleet: FleetSettings, router: RouterClient) -> str | None:
    """Store the workers ``fleet``'s router lists; returns why none were found (a list that
    cannot be read keeps the last look's replicas until it can)."""
    try:
        urls = router.workers()
    except (EngineUnavailableError, BadInputError) as exc:
        return str(exc)
    if not urls:
        return f"fleet {fleet.name}: {redacted(fleet.router_url)} lists no workers"
    fleet_state.save_members(store, fleet.name, urls)
    return None


def _mark_problems(store: Store, fleet: FleetSettings, seen: dict[str, Any], now: float) -> None:
    """Mark (or clear) ``fleet``'s router down and replicas not found; each change is logged
    once, at WARNING when it appears (not at every look)."""
    down = None if seen["router_up"] else f"router {redacted(fleet.router_url)} does not answer"
    marks = [(problems.ROUTER_DOWN, down)]
    if "discovery_error" in seen:  # (not asked: the router is down, which says so already)
        marks.append((problems.UNDISCOVERABLE, seen["discovery_error"]))
    for kind, detail in marks:
        problem, changed = problems.mark(store, kind, fleet.name, detail, now)
        if changed and problem is not None:
            logger.warning("fleet %s: %s: %s", fleet.name, kind, problem.detail)
        elif changed:
            logger.info("fleet %s: %s: gone", fleet.name, kind)


def _look_at_router(
    store: Store, fleet: FleetSettings, router: RouterClient, now: float
) -> dict[str, Any]:
    """Whether the router is up and restarted since the last look (found down then, or its
    request counters went back); its worker list is stored for a fleet that takes it (with
    why it could not be, as ``discovery_error``: absent when the router was not asked)."""
    up = router.is_up()
    looked: dict[str, Any] = {}
    if up and fleet.replicas_from == "router":
        # (a router that does not answer keeps its last list until it does)
        looked["discovery_error"] = _read_workers(store, fleet, router)
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
    return {"router_up": up, "router_restarted": restarted, **looked}


def router_restart_warms(
    settings: Settings,
    store: Store,
    changes: list[dict[str, Any]],
    warm: WarmNow,
    now: float,
    warmed: Collection[str] = (),
) -> list[dict[str, Any]]:
    """Warm-ups through a fleet's router (``warm`` with :data:`ROUTER_RESTARTED`) of

    - every replica whose warm-up through the router failed while it was down, once it
      answers again (at the first look that finds it up, past any cooldown), and
    - for a router that keeps a memory of where prefixes live (``cache_aware``, ``kv_aware``)
      and restarted, so forgot it: every replica of its fleet, past its cooldown,

    unless it was just ``warmed`` (a replica that restarted with it; one owed a warm-up is then
    taken at the next look). Returns what fired."""
    restarted = {c["fleet"] for c in changes if c["router_restarted"]}
    fired = []
    for fleet in settings.fleets:
        seen = fleet_state.router_seen(store, fleet.name) or {}
        if fleet.name not in restarted and not seen.get("up"):  # (restarted: it answers)
            continue
        names = [e.name for e in settings.replicas_of(fleet.name) if e.name not in warmed]
        owed = fleet_state.take_road_failed(store, fleet.name, names)
        record_road_retries(store, fleet.name, len(owed))
        forgot = fleet.name in restarted and forgets_at_restart(fleet.policy)
        for name in names:
            event = TriggerEvent(ROUTER_RESTARTED, name, now, {"fleet": fleet.name})
            if name in owed or (forgot and cooldown_allows(store, event)):
                retry = {"retry": True} if name in owed else {}
                fired.append({**event.to_dict(), **retry, **warm(name, event.kind)})
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
        undiscoverable=None if "discovery_error" not in seen
        else seen["discovery_error"] is not None,
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
