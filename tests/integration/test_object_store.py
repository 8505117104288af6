"""Shared state in object storage: the loop's workers on three hosts that share no folder,
``data_dir`` on a real S3 endpoint (moto's server over HTTP, ``tests/integration/s3_server.py``).

* the loop scenario: three windows of traffic over chat and completions templates, an engine
  restart, nothing typed; the ingest worker (which reads the engine's log on its host), the model
  worker and the warm worker each run in a directory tree of their own; at least 11 of 12 first
  uses after the restart are served from cache, and no file of shared state is left under any
  worker's folder;
* faults: the endpoint unreachable for 30 s in the middle of a window: no crash, no observation
  lost (written when it returns), ``prewarm status`` degraded meanwhile and healthy after.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from benchmarks.stack import in_process_submitter as in_process
from jobs.simulator import SimulatorConfig, SimulatorServer
from models.forecaster import SAVED_NAME
from pipeline.errors import TransientError
from tasks.adapters.model_shelf import current_pointer
from tasks.adapters.observations import Observations
from tasks.adapters.shared_store import SharedStoreUnavailable, shared_store
from tasks.services.loop import WarmLoop
from tasks.services.status import loop_status
from tasks.settings import (
    EngineSettings,
    LoopSettings,
    ScheduleSettings,
    Settings,
    SourceSettings,
)
from tests.conftest import REPO_ROOT
from tests.integration.processes import prewarm_script
from tests.integration.s3_server import BUCKET, s3_endpoint
from tests.integration.test_loop import send

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

WINDOW_S = 10
HEADS = [
    f"You are the assistant for team {name} at Acme. Answer briefly, cite the handbook, and "
    "never share customer data with anyone outside the team. " * 8
    for name in ("billing", "claims", "travel", "legal", "payroll", "security")
]
#: what a worker may keep on its own disk: the engine's log on the ingest host, the beat file
HOST_LOCAL = {".log", ".db"}


def data_dir_of(tmp_path: Path) -> str:
    """A prefix of the bucket of this test's own (moto's buckets outlive one endpoint)."""
    return f"s3://{BUCKET}/{tmp_path.name}"


def worker_settings(
    sim_url: str, log: Path | None, local: Path, store_url: str, data_dir: str
) -> Settings:
    """One worker's settings: the same ``data_dir`` bucket, its own ``local_dir``; only the
    ingest host has the engine's log as a source."""
    engine = EngineSettings(
        name="sim", url=sim_url, model="sim-llm", kind="simulator", cache_tokens=65536,
        cache_block_tokens=16,
    )  # fmt: skip
    sources = (SourceSettings(engine="sim", kind="vllm-log", path=str(log)),) if log else ()
    return Settings(
        redis_url=store_url, store_url=store_url, data_dir=data_dir, local_dir=local,
        engines=(engine,), sources=sources, schedule=ScheduleSettings(window_s=WINDOW_S),
        loop=LoopSettings(min_windows_for_model=2),
    )  # fmt: skip


def one_window_of_traffic(url: str, rounds: int = 2) -> None:
    """Chat and completions requests over every template, then wait for the next window."""
    for n in range(rounds):
        for head in HEADS:
            send(url, head, f"What about case {n}?", chat=False)
            send(url, head, f"And chat case {n}?", chat=True)
    time.sleep(WINDOW_S - time.time() % WINDOW_S + 0.05)


def shared_files_under(folder: Path) -> list[str]:
    """Files under a worker's folder that are not its own (its log, its beat file)."""
    return sorted(
        str(p.relative_to(folder)) for p in folder.rglob("*")
        if p.is_file() and p.suffix not in HOST_LOCAL
    )  # fmt: skip


def test_the_loop_on_s3_with_workers_that_share_no_folder(tmp_path, store_url, store, monkeypatch):
    data_dir = data_dir_of(tmp_path)
    hosts = {name: tmp_path / name for name in ("ingest", "model", "warm")}
    for folder in hosts.values():
        folder.mkdir()
    log = hosts["ingest"] / "logs" / "engine.log"
    log.parent.mkdir()
    with (
        s3_endpoint(monkeypatch) as endpoint,
        SimulatorServer(SimulatorConfig(log_file=log)) as sim,
    ):
        ingest = worker_settings(sim.url, log, hosts["ingest"], store_url, data_dir)
        model = worker_settings(sim.url, None, hosts["model"], store_url, data_dir)
        warm = worker_settings(sim.url, None, hosts["warm"], store_url, data_dir)
        ingest_loop = WarmLoop(ingest, store, submit=in_process(store, ingest))
        model_loop = WarmLoop(model, store, submit=in_process(store, model))
        warm_loop = WarmLoop(warm, store, submit=in_process(store, warm))
        time.sleep(WINDOW_S - time.time() % WINDOW_S + 0.05)
        for _ in range(3):
            one_window_of_traffic(sim.url)
            _, new = ingest_loop.observe(ingest.engine("sim"))  # the ingest host
            assert len(new.records) == 2 * 2 * len(HEADS)  # users' requests, not warm-ups
            with model_loop.models(model.engine("sim")) as root:  # the model worker
                shared = Observations(data_dir, "sim").snapshot()
                model_loop.model_in_use(model.engine("sim"), shared, root)
            store_requests = shared_store(data_dir).counts
            store_requests.reset()
            outcome = warm_loop.tick("sim")  # the warm worker, on beat's window tick
            ticked = store_requests.snapshot()
            assert outcome is not None and outcome["status"] == "submitted", outcome
            assert outcome["store_requests"]["total"] == ticked["total"] > 0  # in its outcome
        assert outcome["observations"]["windows"] == 3 and outcome["observations"]["records"] == 72
        assert current_pointer(data_dir, "sim", SAVED_NAME) is not None  # published by the model
        assert outcome["forecast"].startswith("forecast: model"), outcome["forecast"]

        sim.restart()  # a deploy: the cache is cold
        after = warm_loop.warm_now("sim", "replica")
        assert after["status"] == "submitted", after
        hits = [send(sim.url, h, "A brand new question?", chat) for h in HEADS for chat in (0, 1)]
        served = sum(cached >= 0.5 * prompt for cached, prompt in hits)
        print(f"served from cache on first use after the restart: {served}/{len(hits)}; "
              f"object-store requests of the warm worker's last tick: {ticked}")  # fmt: skip
        assert served >= 11, hits

        keys = shared_store(data_dir).walk("")
        assert {
            "observations/sim/records.parquet",
            "observations/sim/counts.parquet",
            "observations/sim/manifest.json",
            f"models/sim/{SAVED_NAME}/current",
        } <= set(keys)
        for name, folder in hosts.items():
            assert shared_files_under(folder) == [], name
        assert endpoint.url.startswith("http://127.0.0.1:")


def test_an_unreachable_store_mid_window_loses_nothing_and_status_shows_it(
    tmp_path, store_url, store, monkeypatch
):
    log = tmp_path / "ingest" / "engine.log"
    log.parent.mkdir()
    with (
        s3_endpoint(monkeypatch) as endpoint,
        SimulatorServer(SimulatorConfig(log_file=log)) as sim,
    ):
        data_dir = data_dir_of(tmp_path)
        settings = worker_settings(sim.url, log, tmp_path / "ingest", store_url, data_dir)
        loop = WarmLoop(settings, store, submit=in_process(store, settings))
        for head in HEADS[:3]:
            send(sim.url, head, "before the outage", chat=False)
        assert loop.warm_now("sim", "cli")["observations"]["records"] == 3
        assert loop_status(settings, store)["healthy"]

        endpoint.down()  # the store is unreachable for 30 s, in the middle of a window
        down_since = time.monotonic()
        failures = 0
        while time.monotonic() - down_since < 30:
            for head in HEADS:
                send(sim.url, head, f"during the outage {failures}", chat=True)
            with pytest.raises(SharedStoreUnavailable):
                loop.warm_now("sim", "cli")  # transient: the task is retried, nothing crashes
            failures += 1
            status = loop_status(settings, store)
            assert not status["healthy"]
            assert [p["kind"] for p in status["problems"]] == ["shared_store_unavailable"]
            assert "error" in status["engines"][0]["observations"]
            time.sleep(5)
        assert issubclass(SharedStoreUnavailable, TransientError)

        endpoint.up()  # it answers again, with what it held
        outcome = loop.warm_now("sim", "cli")
        assert outcome["observations"]["records"] == 3 + failures * len(HEADS), outcome
        records = Observations(data_dir, "sim").records()
        assert records is not None and len(records) == 3 + failures * len(HEADS)
        status = loop_status(settings, store)
        assert status["healthy"], status["problems"]


def _prewarm(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    return subprocess.run([prewarm_script(), *args], env={**base, **env}, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_commands_take_urls_and_store_copy_moves_an_installation_and_back(
    tmp_path, store_url, monkeypatch
):
    folder = tmp_path / "var-lib-prewarm"
    observations = Observations(folder, "sim")
    records = pd.DataFrame({"ts": [1.7e9, 1.7e9 + 1], "prompt": ["a", "b"]})
    observations.append(records, None, 100, 8)
    (folder / "models" / "sim" / "hotness" / "v0001").mkdir(parents=True)
    (folder / "models" / "sim" / "hotness" / "v0001" / "metadata.json").write_text("{}")
    (folder / "models" / "sim" / "hotness" / "current").write_text("v0001")
    (folder / "repos" / "templates.git").mkdir(parents=True)  # a host's clone: not copied
    (folder / "repos" / "templates.git" / "HEAD").write_text("ref: refs/heads/main\n")
    with s3_endpoint(monkeypatch) as endpoint:
        bucket = data_dir_of(tmp_path)
        copied = _prewarm("store", "copy", str(folder), bucket, env=endpoint.env())
        assert copied.returncode == 0, copied.stderr
        report = json.loads(copied.stdout.strip().splitlines()[-1])
        assert report["objects"] == report["checked"] == 4 and not report["mismatched"]
        assert Observations(bucket, "sim").version().records == 2  # readable where it landed
        back = tmp_path / "restored"
        again = _prewarm("store", "copy", bucket, str(back), env=endpoint.env())
        assert again.returncode == 0, again.stderr
        assert sorted(p.relative_to(back).as_posix() for p in back.rglob("*") if p.is_file()) == [
            "models/sim/hotness/current", "models/sim/hotness/v0001/metadata.json",
            "observations/sim/manifest.json", "observations/sim/records.parquet",
        ]  # fmt: skip

        # ingest a log in the bucket into the bucket, then plan from it into the bucket
        log = REPO_ROOT / "tests" / "data" / "ingest" / "vllm-v0.6.txt"
        shared_store(bucket).write_bytes("logs/vllm.log", log.read_bytes())
        ingested = _prewarm("ingest", f"{bucket}/logs/vllm.log", "--out", f"{bucket}/ingested",
                            "--year", "2024", "--json", env=endpoint.env())  # fmt: skip
        assert ingested.returncode == 0, ingested.stderr
        assert "ingested/records.parquet" in shared_store(bucket).walk("ingested")
        config = tmp_path / "prewarm.toml"
        config.write_text(f'data_dir = "{tmp_path / "plan-data"}"\n[[engines]]\nname = "a"\n'
                          'url = "http://127.0.0.1:1"\nmodel = "m"\n')  # fmt: skip
        planned = _prewarm("-c", str(config), "plan", "--from", f"{bucket}/ingested", "--out",
                           f"{bucket}/plans/plan.json", env={**endpoint.env(),
                           "PREWARM_STORE_URL": store_url})  # fmt: skip
        assert planned.returncode == 0, planned.stderr
        plan = json.loads(shared_store(bucket).read_bytes("plans/plan.json") or b"{}")
        assert plan["engine"] == "a" and plan["items"], plan

        checked = _prewarm("store", "check", bucket, env=endpoint.env())
        assert checked.returncode == 0 and json.loads(checked.stdout)["ok"], checked.stderr
        endpoint.down()
        refused = _prewarm("store", "check", bucket, env=endpoint.env())
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
