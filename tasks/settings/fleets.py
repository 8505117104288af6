"""``[[fleets]]``: a router and its replicas, each replica an engine of its own.

Users reach a router, which picks a replica per request. A fleet names the router (its URL, its
kind and its policy: the policy decides how prewarm warms it) and its replicas: listed
(``[[fleets.replicas]]``, each with its own URL, metrics, log and KV-event endpoint), or taken
from the router's worker list (``replicas_from = "router"``). Every replica becomes an engine
(``[[engines]]``) with the fleet's model and capacity, named ``<fleet>-<host>-<port>`` unless
named, and its log and KV-event stream become its ``[[sources]]``: observation, restart
detection and verification happen per replica, at the replica's own URL.

A replica taken from the router has no entry of its own: its log path and KV-event endpoints
are the fleet's templates with ``{host}``, ``{port}`` and ``{name}`` filled in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from pipeline.router_kinds import policy_problem
from tasks.settings.values import Section, http_url, no_control_characters, zmq_endpoint

#: every router policy of a kind prewarm drives (:mod:`pipeline.router_kinds` says which kind
#: has which; a policy the fleet's router kind lacks is refused, naming ``policy``)
Policy = Literal[
    "cache_aware", "kv_aware", "consistent_hash", "round_robin", "power_of_two", "random",
    "sticky_least_loaded",
]  # fmt: skip
_PLACEHOLDERS = ("host", "port", "name")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


class ReplicaSettings(Section):
    """One listed replica (``[[fleets.replicas]]``); what it leaves out comes from the fleet."""

    url: str
    name: str | None = None
    #: its Prometheus endpoint, when not ``<url>/metrics``
    metrics_url: str | None = None
    #: its request log (a file, a folder or a glob), read as a ``vllm-log`` source
    log: str | None = None
    #: its KV-event publisher and replay socket, as prewarm reaches them
    kv_events: str | None = None
    kv_replay: str | None = None
    cache_tokens: int | None = Field(None, ge=1)

    @field_validator("url", "metrics_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        return None if value is None else http_url(value)

    @field_validator("kv_events", "kv_replay")
    @classmethod
    def _zmq(cls, value: str | None) -> str | None:
        return None if value is None else zmq_endpoint(value)


class FleetSettings(Section):
    """A router and its replicas (``[[fleets]]``)."""

    name: str
    router_url: str
    router: Literal["vllm-router", "sglang-router"] = "vllm-router"
    #: the router's own Prometheus endpoint (``--prometheus-port``): its request counters going
    #: back say it restarted, however briefly (without it, only a look that found it down does)
    router_metrics_url: str | None = None
    policy: Policy = "cache_aware"
    model: str
    #: the engine kind of every replica
    replica_kind: Literal["vllm", "simulator"] = "vllm"
    #: ``list``: the ``[[fleets.replicas]]`` below; ``router``: the router's worker list;
    #: ``dns``: every address ``replicas_dns`` resolves to (a Kubernetes headless Service)
    replicas_from: Literal["list", "router", "dns"] = "list"
    #: ``host:port`` of a DNS name with one address per replica (``replicas_from = "dns"``)
    replicas_dns: str | None = None
    #: the scheme of the replica URLs made from those addresses
    replica_scheme: Literal["http", "https"] = "http"
    replicas: tuple[ReplicaSettings, ...] = ()
    #: templates of each replica's log path and KV-event endpoints ({host}, {port}, {name})
    log: str | None = None
    kv_events: str | None = None
    kv_replay: str | None = None
    tz: str = "UTC"
    year: int | None = None
    # what each replica holds and costs (as [[engines]] say it of one engine)
    max_concurrency: int = Field(4, ge=1, le=256)
    cache_tokens: int | None = Field(None, ge=1)
    cache_block_tokens: int | None = Field(None, ge=1)
    prefill_s_per_token: float | None = Field(None, gt=0)
    adapters: tuple[str, ...] = ()
    #: a replica takes traffic only once its hot set is warmed and verified on it
    #: (:mod:`pipeline.gate`): out of the router's list (and not Ready) until then
    gate: bool = False
    #: ``router``: the gate removes and adds the replica in the router's worker list (and
    #: answers readiness); ``readiness``: it only answers readiness (``/ready/{replica}``, the
    #: ``prewarm gate`` sidecar): the platform (a Kubernetes Service) admits it when Ready
    gate_by: Literal["router", "readiness"] = "router"
    #: seconds after which a replica not yet verified is admitted cold (a gate never blocks
    #: forever): a WARNING, ``prewarm_gate_admitted_cold_total`` and a degraded status
    gate_deadline_s: float = Field(120.0, gt=0)

    @field_validator("router_url", "router_metrics_url")
    @classmethod
    def _router_http(cls, value: str | None) -> str | None:
        return None if value is None else http_url(value)

    @field_validator("replicas_dns")
    @classmethod
    def _dns_address(cls, value: str | None) -> str | None:
        if value is not None:
            dns_address(value)
        return value

    @property
    def discovered(self) -> bool:
        """Whether the replicas are found at each look (the router's list, DNS), not listed."""
        return self.replicas_from != "list"

    @field_validator("log", "kv_events", "kv_replay")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value is None:
            return None
        no_control_characters(value)
        _fill(value, {"host": "h", "port": "1", "name": "n"})  # a bad placeholder fails here
        return value

    @model_validator(mode="after")
    def _policy_of_its_router(self) -> FleetSettings:
        problem = policy_problem(self.router, self.policy)
        if problem is not None:
            raise ValueError(f"policy: {problem}")
        return self

    @model_validator(mode="after")
    def _replicas_as_told(self) -> FleetSettings:
        if self.replicas_from == "list" and not self.replicas:
            raise ValueError(
                'lists no replicas: add [[fleets.replicas]], or replicas_from = "router" or "dns"'
            )
        if self.replicas_from != "list" and self.replicas:
            raise ValueError(
                f"takes its replicas from the {self.replicas_from}: [[fleets.replicas]] is unused"
            )
        if self.gate and self.gate_by == "router" and self.replicas_from == "router":
            raise ValueError(
                "gate = true edits the router's worker list, which then cannot say which "
                'replicas there are: list them, or replicas_from = "dns"'
            )
        if (self.replicas_from == "dns") != (self.replicas_dns is not None):
            raise ValueError('replicas_dns goes with replicas_from = "dns", and only with it')
        names = [replica_name(self, r.url, r.name) for r in self.replicas]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"replica {twice[0]!r} is listed twice")
        return self


def dns_address(value: str) -> tuple[str, int]:
    """``host:port`` as (host, port); anything else is a ``ValueError`` saying what is wrong."""
    no_control_characters(value)
    host, sep, port = value.rpartition(":")
    if not sep or not host or "/" in value or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not host:port (e.g. vllm-headless.llm.svc:8000)")
    return host, int(port)


def _fill(template: str, values: Mapping[str, str]) -> str:
    try:
        return template.format_map(values)
    except (KeyError, IndexError, ValueError) as exc:
        known = ", ".join("{" + p + "}" for p in _PLACEHOLDERS)
        raise ValueError(f"{template!r}: bad placeholder ({exc}); known: {known}") from exc


def replica_name(fleet: FleetSettings, url: str, name: str | None = None) -> str:
    """A replica's engine name: its own, else ``<fleet>-<host>-<port>``."""
    if name:
        return name
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return _UNSAFE_NAME.sub("-", f"{fleet.name}-{parts.hostname}-{port}")


def replica_entries(
    fleet: FleetSettings, urls: Sequence[str] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``[[engines]]`` and ``[[sources]]`` entries of ``fleet``'s replicas: the listed ones,
    or (``urls``) those the router lists now."""
    listed = urls is None
    replicas = list(fleet.replicas) if listed else [ReplicaSettings(url=u) for u in urls or ()]
    engines: list[dict[str, Any]] = []
    sources: list[dict[str, Any]] = []
    for replica in replicas:
        engine, own = _replica_entries(fleet, replica)
        engines.append(engine)
        sources.extend(own)
    return engines, sources


def _replica_entries(
    fleet: FleetSettings, replica: ReplicaSettings
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    name = replica_name(fleet, replica.url, replica.name)
    parts = urlsplit(replica.url)
    values = {"host": parts.hostname or "", "port": str(parts.port or ""), "name": name}
    engine = {
        "name": name, "url": replica.url, "model": fleet.model, "kind": fleet.replica_kind,
        "max_concurrency": fleet.max_concurrency,
        "cache_tokens": replica.cache_tokens or fleet.cache_tokens,
        "cache_block_tokens": fleet.cache_block_tokens,
        "prefill_s_per_token": fleet.prefill_s_per_token, "adapters": fleet.adapters,
        "fleet": fleet.name, "metrics_url": replica.metrics_url,
    }  # fmt: skip
    sources: list[dict[str, Any]] = []
    log = replica.log or (_fill(fleet.log, values) if fleet.log else None)
    if log:
        sources.append({"engine": name, "kind": "vllm-log", "path": log, "tz": fleet.tz,
                        "year": fleet.year, "fleet": fleet.name})  # fmt: skip
    kv = replica.kv_events or (_fill(fleet.kv_events, values) if fleet.kv_events else None)
    if kv:
        replay = replica.kv_replay or (_fill(fleet.kv_replay, values) if fleet.kv_replay else None)
        sources.append({"engine": name, "kind": "kv-events", "endpoint": kv,
                        "replay_endpoint": replay, "fleet": fleet.name})  # fmt: skip
    return engine, sources
