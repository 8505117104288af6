"""``prewarm kv-events`` on the command line: usage mistakes are one line, the health check
answers by the service's heartbeat, and the service runs until it is told to stop."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import redis

from jobs.embedded import free_port
from jobs.simulator import SimulatorConfig, SimulatorServer
from tasks.adapters.kv_state import KvStateStore
from tests.conftest import BROKER_URL, STORE_URL
from tests.integration.processes import prewarm_script
from tests.integration.test_cli_errors import assert_one_line, prewarm

pytestmark = pytest.mark.integration
REDIS_ENV = {"PREWARM_REDIS_URL": BROKER_URL, "PREWARM_STORE_URL": STORE_URL}


def test_a_missing_or_bad_endpoint_is_one_line_and_exit_2():
    for args in ((), ("--endpoint", "http://engine:5557")):
        result = prewarm("kv-events", "--engine", "e", *args, env=REDIS_ENV)
        assert result.returncode == 2
        assert_one_line(result, "--endpoint", "ZMQ endpoint")


@pytest.mark.parametrize("endpoint_from", ["option", "settings"])
def test_the_health_check_follows_the_service(endpoint_from, tmp_path, store_url):
    events = f"tcp://127.0.0.1:{free_port()}"
    env = {**REDIS_ENV, "PREWARM_DATA_DIR": str(tmp_path)}
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    config = SimulatorConfig(kv_events_endpoint=events.replace("127.0.0.1", "*"))
    with SimulatorServer(config) as sim:
        assert prewarm("kv-events", "--engine", "sim", "--check", env=env).returncode == 2
        args = [prewarm_script(), "kv-events", "--engine", "sim"]
        if endpoint_from == "option":
            args += ["--endpoint", events]
        else:  # the engine's [[sources]] kind = "kv-events" entry
            toml = tmp_path / "prewarm.toml"
            toml.write_text(f'[[engines]]\nname = "sim"\nurl = "{sim.url}"\nmodel = "sim-llm"\n'
                            f'[[sources]]\nengine = "sim"\nkind = "kv-events"\n'
                            f'endpoint = "{events}"\n')  # fmt: skip
            env["PREWARM_CONFIG"] = str(toml)
        proc = subprocess.Popen(
            args, env={**inherited, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            state = KvStateStore(redis.Redis.from_url(STORE_URL), "sim")
            deadline = time.monotonic() + 60
            while not state.alive() and time.monotonic() < deadline:
                time.sleep(0.5)
            check = prewarm("kv-events", "--engine", "sim", "--check", env=env)
            assert check.returncode == 0 and "alive" in check.stdout
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert b"kv-events sim:" in out and (tmp_path / "kv" / "sim" / "holdings.msgpack").exists()
