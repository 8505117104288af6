"""Which road a fleet's warm-ups take, by the family of its router's policy.

- Routers that **remember what they routed** (an approximate prefix tree of what it routed per
  worker: vllm-router's ``cache_aware``) learn a prefix's replica only from a request they
  route: a warm-up sent directly to a replica teaches them nothing, and their memory is lost
  when the router restarts. Warmed *through the router*, one prompt per request, exactly as
  users send it, and again after the router restarts.
- Routers that **read the replicas' KV-cache events** (``kv_aware``) see a direct warm-up as
  they see a user's request: warmed *directly on the replica* where the prefix's users land.
- **Spread** placement (``round_robin``, ``power_of_two``, ``random``, ``consistent_hash`` on a
  request id each client draws at random, ``sticky_least_loaded`` whose first placement is by
  load): a prefix's next user may land on any replica, so it is warmed on *every replica*,
  within each replica's capacity.

A router that keeps a memory of where prefixes live (``cache_aware``'s tree, ``kv_aware``'s
index of the events it heard) starts it empty when it restarts. ``kv_aware`` then learns only
from blocks newly stored: a prefix a replica already holds publishes nothing when primed again
there, so the router places its users by load alone (measured on vLLM CPU behind vllm-router
0.1.17: 3 of 6 templates missed after a restart of the router and the replicas). After a router
restart both are warmed *through the router* (:func:`through_router`): the router places each
prime as it will place the prefix's users, and learns where it landed.
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

from pipeline.planner.plan import WarmPlan

#: the trigger kind of a router found restarted (its fleet's replicas are warmed again)
ROUTER_RESTARTED = "router_restarted"


class Road(StrEnum):
    """Where a fleet's warm-ups are sent."""

    THROUGH_ROUTER = "through-router"
    ON_REPLICA = "on-replica"
    EVERY_REPLICA = "every-replica"


_ROADS = {
    "cache_aware": Road.THROUGH_ROUTER,
    "kv_aware": Road.ON_REPLICA,
    "consistent_hash": Road.EVERY_REPLICA,
    "round_robin": Road.EVERY_REPLICA,
    "power_of_two": Road.EVERY_REPLICA,
    "random": Road.EVERY_REPLICA,
    "sticky_least_loaded": Road.EVERY_REPLICA,
}

_WHY = {
    Road.THROUGH_ROUTER: (
        "{policy} remembers what it routed (a prefix tree per replica, empty after a "
        "restart): warmed through the router, one prompt per request as users send it, so the "
        "router learns where the prefix lives"
    ),
    Road.ON_REPLICA: (
        "{policy} reads the replicas' KV-cache events: warmed directly on the replica its "
        "users reach, which the router then sees holding it"
    ),
    Road.EVERY_REPLICA: (
        "{policy} spreads a prefix's requests over the replicas: warmed on every replica, "
        "within each one's capacity"
    ),
}


def road_of(policy: str) -> Road:
    """The road of a router policy; an unknown policy is spread (the road that holds anyway)."""
    return _ROADS.get(policy, Road.EVERY_REPLICA)


def road_note(policy: str) -> str:
    """The plan note saying which road a fleet's warm-up takes and why."""
    road = road_of(policy)
    return f"fleet road {road.value}: " + _WHY[road].format(policy=policy)


#: policies whose router keeps a memory of where prefixes live, empty after it restarts
_REMEMBERING = frozenset({"cache_aware", "kv_aware"})


def forgets_at_restart(policy: str) -> bool:
    """Whether a router with ``policy`` loses what it knew of its replicas when it restarts
    (its fleet is then warmed again, through it)."""
    return policy in _REMEMBERING


def through_router(plan: WarmPlan) -> WarmPlan:
    """``plan`` sent through its fleet's router whatever the policy's road (after the router
    restarted: it learns where each prefix lives from the primes it routes)."""
    note = "fleet road through-router: the router restarted, its memory starts empty"
    return replace(plan, road=Road.THROUGH_ROUTER.value, notes=(*plan.notes, note))


def on_replica(plan: WarmPlan) -> WarmPlan:
    """``plan`` sent directly to its replica whatever the policy's road: a gated replica is out
    of the router's list until it is warm, so the router cannot place its primes."""
    note = "fleet road on-replica: gated, the replica takes no traffic until it is warm"
    return replace(plan, road=Road.ON_REPLICA.value, notes=(*plan.notes, note))
