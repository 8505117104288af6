"""After an ingest of a real (simulator-written) vLLM log: template hotness and a cold cache."""

from __future__ import annotations

from pathlib import Path

import git
import httpx
import pytest

from jobs.simulator import SimulatorConfig, SimulatorServer
from pipeline.ingest import IngestOptions, ingest_to_dir
from tasks.adapters.template_serving import hotness
from tasks.services.ingest_triggers import process_ingest
from tasks.settings import EngineSettings, Settings, TemplateRepoSettings

pytestmark = pytest.mark.integration

HEAD = "You are the claims assistant of Acme Insurance. Ask for the policy number first, " * 2


def _repo(root: Path) -> Path:
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "T").set_value("user", "email", "t@example.com")
    (root / "claims.jinja").write_text(HEAD + "{{ question }}")
    (root / "other.jinja").write_text("Summarise the following support ticket in one line: {{ t }}")
    repo.git.add("--all")
    repo.index.commit("templates")
    return root


def _serve_and_log(log: Path) -> None:
    with SimulatorServer(SimulatorConfig(log_file=log)) as sim:
        assert sim.engine is not None
        for round_ in range(4):  # warm: one shared head
            for n in range(6):
                body = {"prompt": f"{HEAD} round {round_} question {n}", "max_tokens": 1}
                httpx.post(f"{sim.url}/v1/completions", json=body).raise_for_status()
            sim.engine.log_stats()
        httpx.post(f"{sim.url}/reset_prefix_cache").raise_for_status()
        for round_ in range(3):  # cold: nothing shared
            for n in range(10):
                prompt = f"Request {round_}-{n} on a cold topic: " + "describe it. " * 6
                httpx.post(f"{sim.url}/v1/completions", json={"prompt": prompt, "max_tokens": 1})
            sim.engine.log_stats()


def test_ingested_log_gives_hotness_and_warms_the_engine_that_went_cold(tmp_path, store):
    _serve_and_log(tmp_path / "sim.log")
    ingest_to_dir([tmp_path / "sim.log"], tmp_path / "ingest", IngestOptions(model="sim-llm"))
    settings = Settings(
        data_dir=tmp_path / "data",
        engines=(
            EngineSettings(name="sim", url="http://127.0.0.1:9", model="sim-llm"),
            EngineSettings(name="other", url="http://127.0.0.1:9", model="sim-llm"),
        ),
        template_repos=(
            TemplateRepoSettings(name="acme/prompts", url=str(_repo(tmp_path / "src"))),
        ),
    )
    queued: list[tuple[str, str]] = []

    def warm(engine: str, reason: str) -> dict[str, str]:
        queued.append((engine, reason))
        return {"task_id": f"task-{len(queued)}"}

    out = process_ingest(settings, store, tmp_path / "ingest", recent_s=3600, warm=warm)
    assert out["hotness"] == {"acme/prompts": 24}
    assert hotness(store, "acme/prompts") == {"claims.jinja": 24}
    drops = [e for e in out["events"] if e["kind"] == "hit_rate_drop"]
    assert (
        len(drops) == 1 and drops[0]["detail"]["hit_rate"] < 0.75 * drops[0]["detail"]["baseline"]
    )
    assert ("sim", "hit_rate_drop") in queued and ("other", "hit_rate_drop") not in queued
    again = process_ingest(settings, store, tmp_path / "ingest", recent_s=3600, warm=warm)
    assert again["acted"] == []  # the cooldown in Redis holds a second warm-up back
