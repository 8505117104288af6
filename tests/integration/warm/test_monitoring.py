"""A real Prometheus server scrapes the real api while warm-ups run against the simulator.

Prometheus is Debian's ``prometheus`` package (``.ci/run`` installs it), started with the
compose ``monitoring`` profile's own command and ``config/prometheus`` (targets and paths made
local). The warm-ups go through a real Celery worker and real Redis; the engine samples come
from the simulator's ``/metrics``. Then: the alert rules load and evaluate, ``promtool`` accepts
the rules and a scrape, and every query of every dashboard panel returns data.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from jobs.embedded import free_port
from pipeline.triggers import REPLICA_RESTARTED, TriggerEvent
from tasks.adapters import telemetry
from tasks.adapters.cooldowns import cooldown_allows
from tasks.adapters.engine_probe import observe
from tasks.adapters.wal_store import WalStore
from tasks.settings import METRICS_FLUSH_S
from tasks.warm_tasks import recover, submit_plan, wait_plan
from tests.conftest import worker_env
from tests.integration.debian_tools import tool
from tests.integration.processes import prewarm_script, wait_for_http
from tests.integration.warm.conftest import plan_of, prefix_item

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "config"


def dashboard() -> dict[str, Any]:
    return json.loads((CONFIG / "grafana" / "dashboards" / "prewarm.json").read_text())


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, Grafana variables filled in."""
    out = []
    for panel in dashboard()["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "20s").replace("$engine", ".*")
            out.append((panel["title"], expr))
    return out


def prometheus_command(api: str, workdir: Path) -> tuple[list[str], str]:
    """The compose service's command, with a local config, storage and listen address."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = list(compose["services"]["prometheus"]["command"])
    config = yaml.safe_load((CONFIG / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(CONFIG / "prometheus" / Path(f).name) for f in config["rule_files"]]
    config["scrape_configs"][0]["static_configs"] = [{"targets": [api]}]
    local = workdir / "prometheus.yml"
    local.write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_port()}"
    replace = {
        "--config.file": str(local),
        "--storage.tsdb.path": str(workdir / "tsdb"),
        "--web.listen-address": address,
    }
    argv = [tool("prometheus", "prometheus")]
    for arg in command[1:]:
        flag, _, value = arg.partition("=")
        argv.append(f"{flag}={replace.get(flag, value)}")
    return argv, f"http://{address}"


@pytest.fixture
def api(warm_config: Path, store, tmp_path: Path):
    """``prewarm api`` reading the test's store."""
    port = free_port()
    env = worker_env({"PREWARM_CONFIG": str(warm_config)})
    proc = subprocess.Popen(
        [prewarm_script(), "api", "--port", str(port)], env=env, cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", proc, timeout_s=60)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.fixture
def prometheus(api: str, tmp_path: Path):
    argv, url = prometheus_command(api, tmp_path)
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait_for_http(f"{url}/-/ready", proc, timeout_s=60)
        yield url
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def run_warmups(sim, store, settings, queue: str) -> None:
    """What a day of prewarm records: plans warmed by the worker, engine reads around a
    restart, a trigger and its cooldown, a WAL recovery, a loop tick and a closed window."""
    engine = settings.engine("sim")
    telemetry.record_engine_sample(store, "sim", observe(engine)[1])
    sim.restart()
    telemetry.record_engine_sample(store, "sim", observe(engine)[1])
    plans = [plan_of([prefix_item(n, f"mon{p}") for n in range(6)], batch_size=3) for p in (1, 2)]
    for plan in plans:
        wait_plan(submit_plan(plan, "sim", settings=settings, queue=queue), 60, settings=settings)
    telemetry.record_engine_sample(store, "sim", observe(engine)[1])
    event = TriggerEvent(REPLICA_RESTARTED, "sim", time.time())
    assert cooldown_allows(store, event, 30) and not cooldown_allows(store, event, 30)
    wal = WalStore(store, lease_s=0.2)
    wal.begin("dead-plan", 0, "sim", "a-worker-that-died")
    time.sleep(0.3)
    assert recover(settings=settings)
    telemetry.record_tick(store, "sim", ok=True, interval_s=300)
    keys = [item.key for item in plans[0].items] + ["never-seen"]
    deadline = time.monotonic() + 10 * METRICS_FLUSH_S  # the worker's writer thread
    while not set(keys[:-1]) <= set(telemetry.warm_state(store, "sim").warmed_at):
        assert time.monotonic() < deadline, "the worker wrote no metrics of its batches"
        time.sleep(0.05)
    now = time.time()
    outcome = telemetry.record_window(
        store, "sim", (now, now + 300), dict.fromkeys(keys, 2), keys[:-1],
        predicted=dict.fromkeys(keys[:-1], 1.5),
    )  # fmt: skip
    assert outcome.covered == 12 and outcome.misses["new"] == 2


def query(url: str, expr: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


def wait_for_series(url: str, expr: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not query(url, expr):
        assert time.monotonic() < deadline, f"Prometheus never saw {expr}"
        time.sleep(0.5)


def test_prometheus_scrapes_the_cluster_and_every_panel_has_data(
    prometheus, api, sim, store, warm_settings, warm_queue, warm_worker, tmp_path
):
    wait_for_series(prometheus, 'up{job="prewarm"} == 1')
    run_warmups(sim, store, warm_settings, warm_queue)
    wait_for_series(prometheus, 'prewarm_window_requests_total{engine="sim"}')
    time.sleep(4)  # a few more scrapes, so rates over 20 s have two points after the changes

    warmed = query(prometheus, 'sum(prewarm_items_verified_total{engine="sim"})')
    assert float(warmed[0]["value"][1]) == 12  # what the worker did, seen through one scrape
    wal = query(prometheus, 'prewarm_wal_transactions_total{engine="sim"}')
    outcomes = {r["metric"]["outcome"]: float(r["value"][1]) for r in wal}
    assert outcomes == {"committed": 4, "recovered": 1}
    for title, expr in panel_queries():
        assert query(prometheus, expr), f"panel {title!r}: no data for {expr}"

    rules = httpx.get(f"{prometheus}/api/v1/rules").json()["data"]["groups"][0]["rules"]
    assert {r["name"] for r in rules} == {
        "PrewarmLoopStalled", "PrewarmHitRateFallingAfterRestart", "PrewarmWarmupFailures",
        "PrewarmWalTransactionsStuck", "PrewarmStoreDown", "PrewarmFleetReplicasUndiscoverable",
        "PrewarmFleetRouterDown", "PrewarmPlanItemsUnverified", "PrewarmGateAdmittedCold",
    }  # fmt: skip
    assert all(r["health"] == "ok" for r in rules), rules

    scrape = httpx.get(f"http://{api}/metrics").text
    checked = subprocess.run(
        [tool("promtool", "prometheus"), "check", "metrics"],
        input=scrape,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_accepts_the_alert_rules_and_their_unit_tests():
    rules = CONFIG / "prometheus" / "alerts.yml"
    checked = subprocess.run(
        [tool("promtool", "prometheus"), "check", "rules", str(rules)],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 9 rules found" in checked.stdout
    tested = subprocess.run(
        [tool("promtool", "prometheus"), "test", "rules", "alerts_test.yml"],
        capture_output=True, text=True, cwd=CONFIG / "prometheus",
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_dashboard_and_provisioning_point_at_each_other():
    board = dashboard()
    assert board["uid"] and len(board["panels"]) >= 10
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    source = yaml.safe_load(
        (CONFIG / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"][0]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    mounts = compose["grafana"]["volumes"]
    provider = yaml.safe_load(
        (CONFIG / "grafana" / "provisioning" / "dashboards" / "prewarm.yml").read_text()
    )["providers"][0]
    assert any(m.endswith(":" + provider["options"]["path"] + ":ro") for m in mounts)
    assert all("monitoring" in compose[s]["profiles"] for s in ("prometheus", "grafana"))
