"""Replica start-up and restart on the simulator: observed, and warmed at once through the loop
(what its sources showed, plus shapes and adapters); cold-cache detectors with state in Redis."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from jobs.cmd_watch import Watcher
from jobs.simulator import SimulatorConfig, SimulatorServer
from pipeline.template_diff import rewarm_set
from pipeline.templates import jinja_template
from tasks.adapters.engine_probe import observe, parse_metrics
from tasks.adapters.plan_store import PlanStore
from tasks.services.batch_runner import BatchRunner
from tasks.services.rewarm import apply_rewarm
from tasks.settings import EngineSettings, Settings, SourceSettings, TemplateRepoSettings

pytestmark = pytest.mark.integration

HEAD = "You are the claims assistant of Acme Insurance. Ask for the policy number first, " * 2


def _settings(url: str, broker_url: str, store_url: str, data_dir: Path) -> Settings:
    engine = EngineSettings(
        name="sim", url=url, model="sim-llm", kind="simulator", adapters=("sql-lora",)
    )
    repo = TemplateRepoSettings(name="acme/prompts", url="/unused")
    source = SourceSettings(engine="sim", kind="vllm-log", path=str(data_dir / "engine.log"))
    return Settings(
        redis_url=broker_url,
        store_url=store_url,
        data_dir=data_dir,
        engines=(engine,),
        template_repos=(repo,),
        sources=(source,),
    )


def _serve_template(store) -> None:
    template = jinja_template("claims.jinja", "claims.jinja", "jinja", HEAD + "{{ question }}")
    from pipeline.template_diff import ChangeKind, TemplateChange

    plan = rewarm_set([TemplateChange(ChangeKind.ADDED, None, template)])
    apply_rewarm(store, "acme/prompts", "a" * 40, plan, [], lambda items: None)


def _cached(url: str, prompt: str) -> int:
    body = {"model": "sim-llm", "prompt": prompt, "max_tokens": 1}
    return httpx.post(f"{url}/v1/completions", json=body).json()["usage"]["prompt_tokens_details"][
        "cached_tokens"
    ]


def test_metrics_of_the_simulator_parse():
    with SimulatorServer(SimulatorConfig()) as sim:
        httpx.post(f"{sim.url}/v1/completions", json={"prompt": "hello " * 40, "max_tokens": 1})
        text = httpx.get(f"{sim.url}/metrics").text
        sample = parse_metrics("sim", text, 0.0)
        replica, scraped = observe(EngineSettings(name="sim", url=sim.url, model="sim-llm"))
    assert sample.prefix_queries and sample.prefix_queries >= 40
    assert sample.start_time and sample.start_time > 1e9
    assert sample.ttft_buckets and sample.ttft_buckets[-1][1] >= 1
    assert replica.ready and replica.models[0] == "sim-llm" and scraped is not None


def test_unreachable_replica_is_not_ready():
    replica, sample = observe(EngineSettings(name="x", url="http://127.0.0.1:9", model="m"), 0.5)
    assert not replica.healthy and sample is None


def test_ready_and_restarted_replicas_are_warmed_at_once(
    celery_app_configured, broker_url, store_url, store, tmp_path
):
    with SimulatorServer(SimulatorConfig(log_file=tmp_path / "engine.log")) as sim:
        settings = _settings(sim.url, broker_url, store_url, tmp_path)
        _serve_template(store)
        watcher = Watcher(settings, store)  # warms now, in this process
        _traffic(sim.url, HEAD, 3, "first")  # what the replica served before anyone looked
        httpx.post(f"{sim.url}/v1/completions", json={
            "model": "sim-llm", "prompt": "A long report to summarise. " * 60, "max_tokens": 40,
        })  # fmt: skip

        fired = watcher.poll()
        assert [f["kind"] for f in fired] == ["replica_ready"]
        plan, _, engine = PlanStore(store).load(fired[0]["plan_id"])
        kinds = [i.kind for i in plan.items]
        assert engine == "sim" and "reason: replica" in plan.notes
        assert kinds[0] == "adapter" and plan.items[0].adapter == "sql-lora"  # configured
        assert kinds.count("shape") == 2  # two workload shapes seen in its log
        # the template's head is primed: by itself, or as the start of the longer chain the
        # planner primes in its place (priming a chain warms its ancestors)
        heads = [i.text or "" for i in plan.items if i.kind == "prefix"]
        assert any(t and (HEAD.startswith(t) or t.startswith(HEAD)) for t in heads), heads
        result = BatchRunner(store, settings).run(plan.plan_id, 0)
        assert result["ok"] >= len(plan.items) - 1, result  # the simulator loads any adapter
        assert _cached(sim.url, HEAD + "Where is my claim?") >= 16

        assert watcher.poll() == []  # still the same process: nothing to do

        sim.restart()
        assert _cached(sim.url, HEAD + "Where is my claim?") == 0  # a fresh replica is cold
        fired = watcher.poll()
        assert [f["kind"] for f in fired] == ["replica_restarted"]
        assert BatchRunner(store, settings).run(fired[0]["plan_id"], 0)["state"] == "committed"
        assert _cached(sim.url, HEAD + "Is my claim approved?") >= 16


def _traffic(url: str, head: str, count: int, tag: str) -> None:
    for n in range(count):
        body = {"model": "sim-llm", "prompt": f"{head}{tag} question number {n}?", "max_tokens": 1}
        httpx.post(f"{url}/v1/completions", json=body).raise_for_status()


def _cold_traffic(url: str, count: int, topic: str) -> None:
    # Every prompt starts differently: nothing is shared, so next to nothing can hit.
    for n in range(count):
        prompt = f"Request {n} of {count} on {topic}: " + "please describe the situation. " * 4
        body = {"model": "sim-llm", "prompt": prompt, "max_tokens": 1}
        httpx.post(f"{url}/v1/completions", json=body).raise_for_status()


def test_a_cache_gone_cold_raises_a_hit_rate_drop_once(
    celery_app_configured, broker_url, store_url, store, tmp_path
):
    with SimulatorServer(SimulatorConfig()) as sim:
        settings = _settings(sim.url, broker_url, store_url, tmp_path)
        kinds: list[str] = []

        def warm(engine: str, kind: str) -> dict[str, str]:
            kinds.append(kind)
            return {"task_id": "queued"}

        watcher = Watcher(settings, store, warm=warm)
        watcher.poll()  # first look: the replica is new (and warmed), no metrics history yet
        for round_ in range(3):  # warm traffic: a shared head, so most prompt tokens hit
            _traffic(sim.url, HEAD, 8, f"warm{round_}")
            assert not [f for f in watcher.poll() if f["kind"] == "hit_rate_drop"]
        httpx.post(f"{sim.url}/reset_prefix_cache").raise_for_status()
        _cold_traffic(sim.url, 8, "shipping labels")
        fired = watcher.poll()
        assert [f["kind"] for f in fired] == ["hit_rate_drop"] and fired[0]["task_id"] == "queued"
        assert fired[0]["detail"]["hit_rate"] < 0.6 * fired[0]["detail"]["baseline"]
        _cold_traffic(sim.url, 8, "customs forms")
        assert watcher.poll() == []  # the cooldown holds a second drop back
    # one road: the replica's start-up and the drop both went to "warm now", nothing else did
    assert kinds == ["replica_ready", "hit_rate_drop"]


def test_prewarm_watch_once_on_the_command_line(tmp_path, broker_url, store_url):
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT, worker_env

    with SimulatorServer(SimulatorConfig()) as sim:
        config = tmp_path / "prewarm.toml"
        config.write_text(
            f'data_dir = "{tmp_path}"\n'
            f'[[engines]]\nname = "sim"\nurl = "{sim.url}"\nmodel = "sim-llm"\n'
            'adapters = ["sql-lora"]\n'
        )
        env = worker_env({"PREWARM_CONFIG": str(config)})
        code = "from jobs.cli import main; main(['watch', '--once'])"
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # nothing served yet, but a replica that starts gets its configured adapter at once
    assert "replica_ready" in done.stdout and "'items': 1" in done.stdout, done.stdout
