"""Finding a fleet's replicas by DNS: a name with one address per replica, as a Kubernetes
headless Service has (``replicas_from = "dns"``). Each address becomes a replica URL with the
name's port; an address that appears is a new replica, one that goes away a dropped one."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from pipeline.errors import EngineUnavailableError
from tasks.settings.fleets import FleetSettings, dns_address

#: ``socket.getaddrinfo``'s shape (tests pass a resolver of their own)
Resolver = Callable[..., list[tuple[Any, ...]]]


def replica_urls(fleet: FleetSettings, resolve: Resolver = socket.getaddrinfo) -> list[str]:
    """The replica URLs ``fleet.replicas_dns`` resolves to now, sorted; a name that does not
    resolve is :class:`EngineUnavailableError` (the fleet keeps the replicas of its last look)."""
    assert fleet.replicas_dns is not None  # (settings: replicas_from = "dns" names it)
    host, port = dns_address(fleet.replicas_dns)
    try:
        found = resolve(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise EngineUnavailableError(
            f"fleet {fleet.name}: replicas_dns {host} does not resolve ({exc})"
        ) from exc
    addresses = sorted({str(info[4][0]) for info in found})
    return [f"{fleet.replica_scheme}://{_bracketed(a)}:{port}" for a in addresses]


def _bracketed(address: str) -> str:
    """An IPv6 address in brackets, as a URL has it."""
    return f"[{address}]" if ":" in address else address
