"""A fleet found by DNS: every address its name resolves to is a replica URL with the name's
port (IPv6 in brackets, each address once, sorted); a name that does not resolve is a transient
error, so the fleet keeps the replicas of its last look."""

from __future__ import annotations

import socket

import pytest

from pipeline.errors import EngineUnavailableError
from tasks.adapters.replica_dns import replica_urls
from tasks.settings.fleets import FleetSettings


def _fleet(address: str = "vllm-headless:8000", scheme: str = "http") -> FleetSettings:
    return FleetSettings(
        name="k8s", router_url="http://router:30000", model="m", replicas_from="dns",
        replicas_dns=address, replica_scheme=scheme,  # type: ignore[arg-type]
    )  # fmt: skip


def _answer(*addresses: str):
    def resolve(host, port, type=0):
        assert (host, port, type) == ("vllm-headless", 8000, socket.SOCK_STREAM)
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, type, 6, "", (a, port))
            for a in addresses
        ]

    return resolve


def test_every_address_is_a_replica_once():
    resolve = _answer("10.1.0.9", "10.1.0.7", "fd00::3", "10.1.0.7")
    assert replica_urls(_fleet(), resolve) == [
        "http://10.1.0.7:8000",
        "http://10.1.0.9:8000",
        "http://[fd00::3]:8000",
    ]
    assert replica_urls(_fleet(scheme="https"), _answer("10.1.0.7")) == ["https://10.1.0.7:8000"]


def test_a_name_that_does_not_resolve_is_transient_and_named():
    def fails(host, port, type=0):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(EngineUnavailableError, match="fleet k8s: replicas_dns vllm-headless"):
        replica_urls(_fleet(), fails)
