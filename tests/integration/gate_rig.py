"""The gate's scenario for tests: simulator replicas behind the real router, paced users over
every template without pause, one replica restarted and one added — with the gate (the fleet's
replicas listed, ``gate = true``: prewarm edits the router's list) or without (the replicas
taken from the router, warmed by the replica watch once they are in). The measure: of the
requests that reached the restarted or the added replica after it came back, how many were not
served from cache."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from jobs.simulator import SimulatorServer
from tasks.settings.fleets import FleetSettings, ReplicaSettings
from tests.integration.fleet_rig import CAPACITY_BLOCKS, FleetRig, template


@dataclass
class Request:
    """One user request: its template, question, when it was sent, and what it got."""

    n: int
    question: str
    sent: float
    cached: int = 0
    prompt: int = 0
    error: str | None = None

    @property
    def from_cache(self) -> bool:
        return self.error is None and self.cached >= self.prompt // 2


@dataclass
class Users:
    """Paced users over every template through the router, in a thread, until stopped."""

    rig: FleetRig
    templates: int
    pace_s: float = 0.02
    #: users at once (each its own thread): a router balancing on load sees loads differ
    users: int = 4
    requests: list[Request] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Users:
        for first in range(self.users):
            thread = threading.Thread(target=self._run, args=(first,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _run(self, first: int) -> None:
        k = first
        while not self._stop.is_set():
            n = k % self.templates
            request = Request(n, f"user {k}: a question about case {n}?", time.time())
            try:
                request.cached, request.prompt = self.rig.send(n, request.question)
            except httpx.HTTPError as exc:
                request.error = str(exc)
            self.requests.append(request)
            k += self.users
            self._stop.wait(self.pace_s)


#: vllm-router's ``cache_aware`` balancing on load as soon as loads differ (its defaults, 32
#: requests apart, never balance a test's handful of users): a template's users then reach
#: the replica that just joined as they do in a busy fleet
BALANCE_ON_LOAD = ("--balance-abs-threshold", "0", "--balance-rel-threshold", "1.0")


def balancing_on_load(rig: FleetRig) -> FleetRig:
    """``rig`` with its router balancing on load (before it starts)."""
    rig.router.extra = (*rig.router.extra, *BALANCE_ON_LOAD)
    return rig


def landed_on(replica: SimulatorServer, requests: list[Request]) -> list[Request]:
    """The requests whose question ``replica``'s log has (it served them)."""
    assert replica.config.log_file is not None
    text = Path(replica.config.log_file).read_text(errors="replace")
    return [r for r in requests if r.error is None and r.question in text]


class GatedRig(FleetRig):
    """A :class:`FleetRig` whose fleet is gated: its replicas listed, ``gate = true``; the
    gate's plans run in this process (as the rig's other plans do)."""

    def __init__(self, tmp_path: Path, policy: str, count: int, store: Any, store_url: str,
                 deadline_s: float = 60.0, gate_by: str = "router",
                 **fleet: Any) -> None:  # fmt: skip
        self.deadline_s, self.gate_by = deadline_s, gate_by
        self.listed: list[str] = []
        super().__init__(tmp_path, policy, count, store, store_url, **fleet)
        self.listed = [r.url for r in self.replicas]
        self._configure()

    def fleet_settings(self) -> FleetSettings:
        base = super().fleet_settings()
        if not self.listed:  # (the base class's settings, before the replicas are up)
            return base
        return base.model_copy(update={
            "replicas_from": "list", "gate": True, "gate_deadline_s": self.deadline_s,
            "gate_by": self.gate_by,
            "replicas": tuple(ReplicaSettings(url=u) for u in self.listed),
        })  # fmt: skip

    def _configure(self) -> None:
        fleets = (self.fleet_settings(),)
        self.settings = self.settings.model_copy(update={"fleets": fleets}).with_members({})
        self.watcher.configured = self.settings
        self.watcher.gate_submit = self._submit(self.settings)

    def add_replica(self) -> SimulatorServer:
        """A new replica, listed in prewarm's settings (the gate adds it to the router)."""
        replica = self._replica()
        self.replicas.append(replica)
        self.listed.append(replica.url)
        self._configure()
        return replica


def _toml_value(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


def write_config(rig: GatedRig, path: Path, urls: list[str]) -> Path:
    """The fleet's settings as a TOML file (what the sidecar's pod mounts)."""
    fleet = rig.fleet_settings()
    keys = ("name", "router_url", "router", "policy", "model", "replica_kind", "log",
            "cache_tokens", "cache_block_tokens", "gate", "gate_by", "gate_deadline_s")  # fmt: skip
    lines = [f"redis_url = {_toml_value(rig.settings.redis_url)}",
             f"store_url = {_toml_value(rig.settings.store_url)}",
             f"data_dir = {_toml_value(str(rig.settings.data_dir))}", "", "[[fleets]]"]  # fmt: skip
    lines += [f"{k} = {_toml_value(getattr(fleet, k))}" for k in keys]
    for url in urls:
        lines += ["", "[[fleets.replicas]]", f"url = {_toml_value(url)}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def cold_share(replicas: list[SimulatorServer], requests: list[Request]) -> tuple[int, int]:
    """(requests that reached ``replicas``, of them not served from cache)."""
    reached = [r for replica in replicas for r in landed_on(replica, requests)]
    return len(reached), sum(not r.from_cache for r in reached)


def watch_for(rig: FleetRig, seconds: float, every_s: float = 0.1) -> None:
    """The replica watch (and gate) polling every ``every_s`` for ``seconds``."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        rig.poll()
        time.sleep(every_s)


def scenario(rig: FleetRig, templates: int, gated: bool, down_s: float = 1.0) -> dict[str, Any]:
    """Users without pause; replica 0 restarted (down ``down_s``), then a replica added; the
    watch polling all along. Returns the counts per event."""
    users = Users(rig, templates).start()
    try:
        watch_for(rig, 1.0)
        restarted = rig.replicas[0]
        restarted.stop()
        watch_for(rig, down_s)
        mark = len(users.requests)
        restarted.start()
        watch_for(rig, 3.0)
        added = rig.add_replica() if isinstance(rig, GatedRig) else rig.scale_out()
        watch_for(rig, 6.0)
        # a router balancing on load sends the new replica users only when the others are
        # busier: on a loaded machine that can take longer than 6 s
        until = time.monotonic() + 20.0
        while time.monotonic() < until and len(landed_on(added, users.requests[mark:])) < 4:
            watch_for(rig, 1.0)
    finally:
        users.stop()
    after = users.requests[mark:]
    reached_r, cold_r = cold_share([restarted], after)
    reached_a, cold_a = cold_share([added], after)
    errors = sum(r.error is not None for r in users.requests)
    return {
        "gate": gated, "requests": len(users.requests), "errors": errors,
        "restarted": {"reached": reached_r, "cold": cold_r},
        "added": {"reached": reached_a, "cold": cold_a},
    }  # fmt: skip


__all__ = ["CAPACITY_BLOCKS", "GatedRig", "Users", "cold_share", "scenario", "template"]
