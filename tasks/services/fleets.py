"""Fleets: a router and its replicas, each replica an engine of the loop.

A fleet whose replicas are listed has them in its settings; one that takes them from its router
has them as the router listed them at the last look (kept in the store, so every process sees
the same replicas). :func:`fleet_settings` gives settings with every fleet's current replicas
as engines; :func:`look_at_fleets` asks each router for its workers (a replica that appears is
then new to the replica watch, which warms it at once; one that goes away is dropped), and
records each fleet, replica by replica, for ``/metrics``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from pipeline.errors import EngineUnavailableError
from pipeline.fleet_roads import road_note, road_of
from tasks.adapters import fleet_state
from tasks.adapters.connections import redacted
from tasks.adapters.router_client import RouterClient
from tasks.adapters.store import Store
from tasks.adapters.telemetry import record_fleet
from tasks.settings import Settings
from tasks.settings.fleets import FleetSettings

#: a client of a fleet's router (tests pass one with a mock transport)
RouterFor = Callable[[FleetSettings], RouterClient]


def _routed(settings: Settings) -> list[str]:
    return [f.name for f in settings.fleets if f.replicas_from == "router"]


def fleet_settings(settings: Settings, store: Store) -> Settings:
    """``settings`` with every fleet's current replicas as engines (those a router lists: as it
    listed them at the last look)."""
    routed = _routed(settings)
    if not routed:
        return settings
    return settings.with_members(fleet_state.members(store, routed))


def look_at_fleets(
    settings: Settings, store: Store, router_for: RouterFor = RouterClient
) -> tuple[Settings, list[dict[str, Any]]]:
    """One look at every fleet's router: its worker list (for fleets that take their replicas
    from it) is stored; returns the settings with the current replicas and what changed."""
    before = fleet_settings(settings, store)
    up: dict[str, bool] = {}
    for fleet in settings.fleets:
        with router_for(fleet) as router:
            up[fleet.name] = router.is_up()
            if up[fleet.name] and fleet.replicas_from == "router":
                # (a router that does not answer keeps its last list until it does)
                with contextlib.suppress(EngineUnavailableError):
                    fleet_state.save_members(store, fleet.name, router.workers())
    after = fleet_settings(settings, store)
    changes = [
        {"fleet": f.name, "router_up": up[f.name], **_record(store, f, before, after, up[f.name])}
        for f in settings.fleets
    ]
    return after, [c for c in changes if c["added"] or c["removed"]]


def _record(
    store: Store, fleet: FleetSettings, before: Settings, after: Settings, up: bool
) -> dict[str, Any]:
    road = road_of(fleet.policy).value
    old = {e.name for e in before.replicas_of(fleet.name)}
    now = {e.name for e in after.replicas_of(fleet.name)}
    record_fleet(
        store, fleet.name, {name: (fleet.policy, road) for name in now},
        [(name, fleet.policy, road) for name in sorted(old - now)], router_up=up,
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
