"""The warm-up loop on a real Redis and the engine simulator: sources, observations, ticks,
every reason through the one planner, and bounded state over many ticks.

Plans run in this process through the real batch runner and WAL (``BatchRunner``), so a test
can drive hundreds of ticks without a worker; the services' own path (beat → worker) is
covered by the compose scenario test.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest
import redis

from benchmarks.stack import in_process_submitter as in_process
from jobs.embedded import free_port
from jobs.simulator import SimulatorConfig, SimulatorServer
from pipeline.ingest import IngestOptions, ingest_paths
from pipeline.planner.reasons import REASONS
from pipeline.windows import COUNT_DTYPES
from tasks.adapters import telemetry
from tasks.adapters.observations import Observations
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.sources import SourceStates, read_new
from tasks.services import planning
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
from tests.integration.processes import prewarm_script, wait_for_http

pytestmark = pytest.mark.integration

HEADS = [
    f"You are the assistant for team {name} at Acme. Answer briefly, cite the handbook, and "
    "never share customer data with anyone outside the team. " * 8
    for name in ("billing", "claims", "travel", "legal")
]


def settings_for(url: str, log: Path, data_dir: Path, broker: str, store: str, **kw) -> Settings:
    engine = EngineSettings(
        name="sim", url=url, model="sim-llm", kind="simulator", cache_tokens=65536,
        cache_block_tokens=16,
    )  # fmt: skip
    return Settings(
        redis_url=broker, store_url=store, data_dir=data_dir, engines=(engine,),
        sources=(SourceSettings(engine="sim", kind="vllm-log", path=str(log)),),
        schedule=ScheduleSettings(window_s=kw.pop("window_s", 60)), **kw,
    )  # fmt: skip


def send(url: str, head: str, question: str, chat: bool) -> tuple[int, int]:
    """(cached tokens, prompt tokens) of one request."""
    if chat:
        messages = [{"role": "system", "content": head}, {"role": "user", "content": question}]
        body = {"model": "sim-llm", "messages": messages, "max_tokens": 1}
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
    else:
        body = {"model": "sim-llm", "prompt": head + question, "max_tokens": 1}
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    usage = response.raise_for_status().json()["usage"]
    return int(usage["prompt_tokens_details"]["cached_tokens"]), int(usage["prompt_tokens"])


def traffic(url: str, rounds: int, heads=HEADS) -> None:
    for n in range(rounds):
        for head in heads:
            send(url, head, f"What about case {n}?", chat=False)
            send(url, head, f"And chat case {n}?", chat=True)


@pytest.fixture
def sim(tmp_path):
    with SimulatorServer(SimulatorConfig(log_file=tmp_path / "engine.log")) as server:
        yield server


@pytest.fixture
def loop_settings(sim, tmp_path, store_url):
    return settings_for(sim.url, tmp_path / "engine.log", tmp_path / "data", store_url, store_url)


def test_sources_resume_where_another_reader_stopped_and_never_take_half_a_line(
    tmp_path, store_url, store
):
    text = (REPO_ROOT / "tests" / "data" / "ingest" / "vllm-v0.6.txt").read_text()
    log = tmp_path / "vllm.log"
    log.write_text(text[: len(text) // 2 + 7])  # the log writer is in the middle of a line
    engine = EngineSettings(name="e", url="http://127.0.0.1:9", model="m")
    source = SourceSettings(engine="e", kind="vllm-log", path=str(log), year=2024)
    settings = Settings(store_url=store_url, data_dir=tmp_path, engines=(engine,),
                        sources=(source,))  # fmt: skip
    first = read_new(settings, store, engine)
    assert len(first.records) == 1 and first.reads[0].error is None
    read_up_to = first.reads[0].offsets[str(log)]
    assert text[:read_up_to].endswith("\n") and read_up_to < log.stat().st_size
    with log.open("a") as handle:  # the writer finishes its line and goes on
        handle.write(text[len(text) // 2 + 7 :])
    other = redis.Redis.from_url(store_url)  # another worker, same store
    second = read_new(settings, other, engine)
    everything = ingest_paths([log], IngestOptions(format="vllm", year=2024))
    assert len(first.records) + len(second.records) == len(everything.records) == 2
    assert len(read_new(settings, store, engine).records) == 0  # nothing is read twice
    offsets = SourceStates(store).statuses("e")[f"vllm-log:{log}"]["offsets"]
    assert offsets[str(log)] == log.stat().st_size


def test_a_vanished_source_is_reported_and_the_others_are_still_read(tmp_path, store_url, store):
    good = tmp_path / "a.jsonl"
    good.write_text(json.dumps({"ts": 1.7e9, "prompt": "x " * 50}) + "\n")
    engine = EngineSettings(name="e", url="http://127.0.0.1:9", model="m")
    sources = (
        SourceSettings(engine="e", kind="jsonl", path=str(tmp_path / "gone" / "*.jsonl")),
        SourceSettings(engine="e", kind="jsonl", path=str(good)),
    )
    settings = Settings(store_url=store_url, data_dir=tmp_path, engines=(engine,), sources=sources)
    new = read_new(settings, store, engine)
    assert len(new.records) == 1
    missing, found = new.reads
    assert "no file matches" in (missing.error or "") and found.error is None
    status = loop_status(settings, store)["engines"][0]["sources"]
    assert "no file matches" in status[0]["error"]


def test_window_tick_plans_from_observations_and_warms_chat_and_completions(
    sim, loop_settings, store
):
    traffic(sim.url, 3)
    loop = WarmLoop(loop_settings, store, submit=in_process(store, loop_settings))
    outcome = loop.tick("sim", now=1_800_000_000.0)
    assert outcome is not None and outcome["status"] == "submitted", outcome
    assert loop.tick("sim", now=1_800_000_030.0) is None  # same window: once only
    assert outcome["observations"]["records"] == 24 and outcome["forecast"] == "forecast: frequency"
    sim.restart()  # a deploy: the cache is cold
    after = loop.warm_now("sim", "replica")
    assert after["status"] == "submitted"
    hits = [send(sim.url, h, "A brand new question?", chat) for h in HEADS for chat in (0, 1)]
    assert all(cached >= 0.8 * prompt for cached, prompt in hits), hits
    status = loop_status(loop_settings, store)["engines"][0]
    assert status["last_tick"]["window"] == "2027-01-15T08:00:00+00:00"
    assert status["last_plan"]["reason"] == "replica" and status["last_plan"]["failed"] == 0
    assert status["last_plan"]["verified"] == after["planned"]


def _reads_of_observations(monkeypatch, folder: Path) -> dict[str, int]:
    """Count every Parquet read of a file in ``folder`` and every manifest read there."""
    reads: dict[str, int] = {}
    real_parquet, real_version = pd.read_parquet, Observations.version

    def read_parquet(path, *args, **kwargs):
        if Path(path).parent == folder:
            reads[Path(path).name] = reads.get(Path(path).name, 0) + 1
        return real_parquet(path, *args, **kwargs)

    def version(self):
        if self.folder == folder:
            reads["manifest.json"] = reads.get("manifest.json", 0) + 1
        return real_version(self)

    monkeypatch.setattr(pd, "read_parquet", read_parquet)
    monkeypatch.setattr(Observations, "version", version)
    return reads


def test_a_tick_reads_each_observation_file_once_and_plans_on_the_version_it_observed(
    sim, tmp_path, store_url, store, monkeypatch
):
    settings = settings_for(sim.url, tmp_path / "engine.log", tmp_path / "data", store_url,
                            store_url, loop=LoopSettings(min_windows_for_model=2))  # fmt: skip
    observations = Observations(settings.data_dir, "sim")
    minute = time.time() // 60 * 60
    history = [r for w in (3, 2, 1) for r in _window_counts(minute - 60 * w, {"p:old": 5})]
    observations.append(None, pd.DataFrame(history).astype(COUNT_DTYPES), 1000, 100)
    traffic(sim.url, 2)
    reads = _reads_of_observations(monkeypatch, observations.folder)
    loop = WarmLoop(settings, store, submit=in_process(store, settings))
    outcome = loop.tick("sim", now=1_800_000_000.0)
    assert outcome is not None and outcome["status"] == "submitted", outcome
    # the model was selected and saved on the snapshot's counts, and the plan used it
    assert outcome["model"] is not None and outcome["forecast"].startswith("forecast: model")
    assert reads == {"records.parquet": 1, "counts.parquet": 1, "manifest.json": 1}
    assert outcome["observations"]["version"] == 2 and outcome["observations"]["records"] == 16


def test_the_window_close_measures_the_forecast_of_the_plan_made_for_that_window(
    sim, tmp_path, store_url, store
):
    settings = settings_for(sim.url, tmp_path / "engine.log", tmp_path / "data", store_url,
                            store_url, window_s=3600)  # fmt: skip
    loop = WarmLoop(settings, store, submit=in_process(store, settings))
    traffic(sim.url, 2)
    start = time.time() // 3600 * 3600
    first = loop.tick("sim", now=start)
    assert first is not None and first["status"] == "submitted", first
    planned, _, _ = PlanStore(store).load(first["plan_id"])
    expected = sum(item.predicted_hits for item in planned.items)
    traffic(sim.url, 2)
    assert loop.tick("sim", now=start + 3600) is not None  # closes [start, start + 3600)
    closed = [e for e in telemetry.history(store, "sim") if e["kind"] == "window"]
    assert len(closed) == 1 and closed[0]["window_start"] == start
    assert closed[0]["requests"] == 32
    assert closed[0]["predicted"] == pytest.approx(expected)
    series = dict(telemetry.read_series(store)["prewarm_forecast_absolute_error_requests"])
    assert series[("sim",)] == closed[0]["absolute_error"] > 0


def test_the_loop_does_not_read_its_own_warm_ups_back_as_demand(sim, loop_settings, store):
    traffic(sim.url, 2)
    loop = WarmLoop(loop_settings, store, submit=in_process(store, loop_settings))
    first = loop.warm_now("sim", "cli")
    assert first["status"] == "submitted" and first["observations"]["records"] == 16
    again = loop.warm_now("sim", "cli")  # reads the log the warm-up wrote into
    assert again["sources"][0]["own"] >= first["planned"] > 0
    assert again["sources"][0]["records"] == 0
    records = Observations(loop_settings.data_dir, "sim").records()
    assert records is not None and len(records) == 16
    assert not records["request_id"].str.contains("prewarm-").any()


def test_an_engine_that_is_down_gets_no_plan_and_a_status_line(sim, loop_settings, store):
    traffic(sim.url, 1)
    sim.stop()
    outcome = WarmLoop(loop_settings, store, submit=in_process(store, loop_settings)).warm_now(
        "sim", "window"
    )
    assert outcome["status"].startswith("engine down: no plan") and outcome["plan_id"] is None
    assert outcome["observations"]["records"] == 8  # its traffic was still observed
    sim.start()


def test_every_reason_plans_through_plan_for(sim, loop_settings, store, monkeypatch):
    calls: list[str] = []
    real = planning.plan_for

    def spy(*args, **kwargs):
        plan = real(*args, **kwargs)
        calls.append(plan.plan_id)
        return plan

    monkeypatch.setattr(planning, "plan_for", spy)
    traffic(sim.url, 2)
    loop = WarmLoop(loop_settings, store, submit=in_process(store, loop_settings))
    plans = {}
    for reason in ("window", "replica", "trigger", "demo"):
        outcome = loop.warm_now("sim", reason)
        plans[reason] = PlanStore(store).load(outcome["plan_id"])[0]
    from jobs.cmd_warm import build_plan_from
    from tasks.services.rewarm import template_plan

    observed = Observations(loop_settings.data_dir, "sim").records_path
    monkeypatch.setenv("PREWARM_CONFIG", str(_config_file(loop_settings, observed.parent)))
    from tasks.settings import current_settings

    current_settings.cache_clear()
    plans["cli"] = build_plan_from(observed, "sim")
    current_settings.cache_clear()
    from pipeline.template_diff import RewarmSet
    from pipeline.templates import jinja_template

    template = jinja_template("t.jinja", "t.jinja", "jinja", HEADS[0] + "{{ q }}")
    rewarm = RewarmSet(warm=(template,), retire=(), changes=())
    plans["template"] = template_plan(loop_settings, loop_settings.engine("sim"), rewarm, {})
    assert set(plans) == set(REASONS)
    for reason, plan in plans.items():
        assert plan.reason == reason and plan.plan_id in calls, reason
        assert plan.items, reason
    assert any(i.kind == "shape" for i in plans["replica"].items)  # a replica gets its shapes
    endpoints = {i.endpoint for i in plans["template"].items}
    assert endpoints == {"chat", "completions"}  # template users of both kinds are primed


def _config_file(settings: Settings, folder: Path) -> Path:
    engine = settings.engines[0]
    path = folder / "prewarm.toml"
    path.write_text(
        f'store_url = "{settings.store_redis_url}"\ndata_dir = "{settings.data_dir}"\n'
        f'[[engines]]\nname = "sim"\nurl = "{engine.url}"\nmodel = "sim-llm"\n'
    )
    return path


def _rss_kib() -> int:
    """This process's resident memory now (not its peak), in KiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_two_hundred_ticks_keep_redis_keys_and_memory_bounded(tmp_path, store_url, store):
    """Bound: after 200 window ticks (traffic in every window), the store holds no more keys
    than after 20 ticks (plans beyond ``loop.keep_plans`` are deleted with their WAL records),
    the observations keep at most ``keep_windows`` windows, and this process's resident memory
    grows by less than 64 MiB from tick 20 to tick 200 (the learning libraries imported first:
    a one-time cost, not growth). The simulator runs as its own process (``prewarm simulator``,
    zero latency), so only the loop is measured."""
    port = free_port()
    log = tmp_path / "engine.log"
    argv = [prewarm_script(), "simulator", "--port", str(port), "--log-file", str(log),
            "--prefill-ms-per-token", "0", "--decode-ms-per-token", "0", "--overhead-ms", "0",
            "--no-stdout-log"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    sim = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_http(f"{url}/health", sim, timeout_s=180)
        _two_hundred_ticks(url, log, tmp_path, store_url, store)
    finally:
        sim.terminate()
        sim.wait(20)


def _two_hundred_ticks(url: str, log: Path, tmp_path: Path, store_url: str, store) -> None:
    settings = settings_for(
        url, log, tmp_path / "data", store_url, store_url,
        loop=LoopSettings(keep_windows=24, keep_records=400, keep_plans=4), window_s=60,
    )  # fmt: skip
    loop = WarmLoop(settings, store, submit=in_process(store, settings))
    # Once the observations span `min_windows_for_model` windows (real minutes here) the loop
    # fits a forecaster: LightGBM's import (~90 MiB, once per process) is not growth.
    import models.forecaster  # noqa: F401 - imported for its one-time memory only

    start = 1_800_000_000.0
    keys_at, rss_at = {}, {}
    for n in range(200):
        traffic(url, 1, HEADS[n % 2 :: 2])
        outcome = loop.tick("sim", now=start + 60 * n)
        assert outcome is not None and outcome["status"] in ("submitted", "plan empty")
        assert n < 4 or outcome["status"] == "submitted", outcome  # each head seen twice
        if n + 1 in (20, 110, 200):
            gc.collect()
            keys_at[n + 1], rss_at[n + 1] = store.dbsize(), _rss_kib()
    print(f"200 ticks: store keys {keys_at}, resident KiB {rss_at}", flush=True)
    assert keys_at[200] <= keys_at[20]
    assert rss_at[200] - rss_at[20] < 64 * 1024
    assert Observations(settings.data_dir, "sim").version().windows <= 24


def test_the_api_and_the_cli_show_the_same_status(sim, loop_settings, store, monkeypatch):
    from starlette.testclient import TestClient

    from jobs.api import build_api
    from tasks.settings import current_settings

    traffic(sim.url, 2)
    WarmLoop(loop_settings, store, submit=in_process(store, loop_settings)).tick("sim")
    config = Path(loop_settings.data_dir) / "status.toml"
    config.write_text(
        f'store_url = "{loop_settings.store_redis_url}"\nredis_url = '
        f'"{loop_settings.store_redis_url}"\ndata_dir = "{loop_settings.data_dir}"\n'
        f'[[engines]]\nname = "sim"\nurl = "{sim.url}"\nmodel = "sim-llm"\n'
        f'[[sources]]\nengine = "sim"\nkind = "vllm-log"\n'
        f'path = "{loop_settings.sources[0].path}"\n'
    )
    monkeypatch.setenv("PREWARM_CONFIG", str(config))
    current_settings.cache_clear()
    try:
        body = TestClient(build_api(current_settings())).get("/status").json()
    finally:
        current_settings.cache_clear()
    engine = body["engines"][0]
    assert body["healthy"] is True and engine["last_tick"]["status"] == "submitted"
    assert engine["sources"][0]["offsets"] and engine["last_tick"]["verified"] > 0
    assert engine["next_tick_in_s"] is not None


def _window_counts(start: float, keys: dict[str, int]) -> list[dict]:
    ts = pd.Timestamp(start, unit="s", tz="UTC")
    return [{"item_kind": "prefix", "item_key": key, "window_start": ts, "requests": n,
             "prompt_tokens": 100 * n, "output_tokens": 0} for key, n in keys.items()]  # fmt: skip


def test_key_drift_of_the_last_window_is_a_trigger_of_the_tick_with_a_cooldown(
    tmp_path, store_url, store
):
    settings = settings_for("http://127.0.0.1:9", tmp_path / "engine.log", tmp_path / "data",
                            store_url, store_url, window_s=60)  # fmt: skip
    engine = settings.engines[0]
    observations = Observations(settings.data_dir, engine.name)
    steady = {"p:billing": 40, "p:claims": 30, "p:travel": 20}
    rows = [r for w in range(7) for r in _window_counts(60.0 * w, steady)]
    steady_snapshot = observations.append(None, pd.DataFrame(rows).astype(COUNT_DTYPES), 1000, 100)
    loop = WarmLoop(settings, store, submit=in_process(store, settings), clock=lambda: 60.0 * 8)
    assert loop.key_drift(engine, steady_snapshot, 60.0 * 8) is None  # the same keys every window

    moved = _window_counts(60.0 * 7, {"p:legal": 60, "p:audit": 40})
    snapshot = observations.append(None, pd.DataFrame(moved).astype(COUNT_DTYPES), 1000, 100)
    event = loop.key_drift(engine, snapshot, 60.0 * 8)
    assert event is not None and event.kind == "key_drift" and event.engine == "sim"
    assert event.ts == 60.0 * 7 and event.detail["js_divergence"] > 0.35
    assert loop.key_drift(engine, snapshot, 60.0 * 8) is None  # its cooldown holds it back
    fired = telemetry.read_series(store)["prewarm_trigger_firings_total"]
    assert fired == [(("sim", "key_drift"), 1.0)]
