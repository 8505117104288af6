"""``prewarm plan``, ``prewarm warm`` and ``prewarm wal`` as an operator runs them."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pandas as pd
import pytest

from pipeline.planner.plan import WarmPlan
from pipeline.records import records_frame
from tasks.adapters.wal_store import WalStore
from tests.conftest import REPO_ROOT, worker_env

pytestmark = pytest.mark.integration
SYSTEMS = [f"You are the assistant of team {t}. Answer in three sentences, cite the policy. " * 5
           for t in ("billing", "search", "legal")]  # fmt: skip


def prewarm(config, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = worker_env({"PREWARM_CONFIG": str(config)})
    cmd = [sys.executable, "-c", "from jobs.cli import main; main()", *args]
    return subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def _records(path):
    start = pd.Timestamp("2026-01-01T00:00:00Z")
    rows = []
    for n in range(60):
        team = 0 if n % 2 else (1 if n % 3 else 2)  # billing most, legal least
        rows.append({"ts": start + pd.Timedelta(seconds=10 * n), "model": "sim-llm",
                     "prompt": SYSTEMS[team] + f"Question {n}: what about case {n * 13}?",
                     "endpoint": "completions", "source": "vllm"})  # fmt: skip
    records_frame(rows).to_parquet(path / "records.parquet")
    return path


def test_plan_then_warm_from_the_command_line(
    warm_config, warm_worker, warm_queue, store, tmp_path
):
    source = _records(tmp_path)
    out = tmp_path / "plan.json"
    planned = prewarm(
        warm_config, "plan", "--from", str(source), "--engine", "sim", "--out", str(out)
    )
    assert planned.returncode == 0, planned.stderr
    plan = WarmPlan.from_json(out.read_text())
    assert len(plan.items) == 3 and all(i.kind == "prefix" for i in plan.items)
    assert plan.items[-1].text is not None and plan.items[-1].text.startswith(SYSTEMS[0][:40])
    warmed = prewarm(warm_config, "warm", "--plan", str(out), "--queue", warm_queue)
    assert warmed.returncode == 0, warmed.stderr + warmed.stdout
    assert '"committed": 1' in warmed.stdout and '"items_ok": 3' in warmed.stdout


def _printed_report(stdout: str) -> dict:
    return json.loads(stdout[stdout.rindex("\n{") + 1 :])


def test_warm_on_a_finished_plan_reports_it_finished(
    warm_config, warm_worker, warm_queue, tmp_path
):
    out = tmp_path / "plan.json"
    planned = prewarm(warm_config, "plan", "--from", str(_records(tmp_path)), "--out", str(out))
    assert planned.returncode == 0, planned.stderr
    first = prewarm(warm_config, "warm", "--plan", str(out), "--queue", warm_queue)
    assert first.returncode == 0, first.stderr + first.stdout
    again = prewarm(warm_config, "warm", "--plan", str(out), "--queue", warm_queue)
    assert again.returncode == 0, again.stderr + again.stdout
    report = _printed_report(again.stdout)
    assert report["done"] and report["state"] == "finished" and report["seconds"] >= 0
    assert report["ok"] and report["failed_batches"] == []


def test_warm_exits_non_zero_when_a_batch_rolls_back(
    sim, warm_config, warm_worker, warm_queue, tmp_path
):
    out = tmp_path / "plan.json"
    planned = prewarm(warm_config, "plan", "--from", str(_records(tmp_path)), "--out", str(out))
    assert planned.returncode == 0, planned.stderr
    sim.engine.config.faults.error_rate = 1.0
    try:
        warmed = prewarm(warm_config, "warm", "--plan", str(out), "--queue", warm_queue)
    finally:
        sim.engine.config.faults.error_rate = 0.0
    assert warmed.returncode == 1, warmed.stderr + warmed.stdout
    report = _printed_report(warmed.stdout)
    assert report["done"] and not report["ok"] and report["rolled_back"] == 1
    [batch] = report["failed_batches"]
    assert batch["state"] == "rolled_back" and batch["failed"] == 3 and batch["failures"]


@pytest.fixture
def in_process(warm_config, monkeypatch):
    """Run ``prewarm`` in this process with the simulator's settings (fast, same code path)."""
    from jobs.cli import main
    from tasks import settings as settings_module

    monkeypatch.setenv("PREWARM_CONFIG", str(warm_config))
    settings_module.current_settings.cache_clear()
    yield main
    settings_module.current_settings.cache_clear()


def test_bad_input_is_one_line(in_process, tmp_path, capsys):
    with pytest.raises(SystemExit) as missing:
        in_process(["plan", "--from", str(tmp_path / "nowhere"), "--engine", "sim"])
    err = capsys.readouterr().err
    assert missing.value.code == 2 and "records.parquet" in err and "Traceback" not in err
    (tmp_path / "bad.json").write_text('{"plan_id": "p", "engine": "sim", "items": [{"kind": 1}]}')
    with pytest.raises(SystemExit) as bad:
        in_process(["warm", "--plan", str(tmp_path / "bad.json")])
    assert bad.value.code == 2 and "items[0]" in capsys.readouterr().err


def test_wal_status_and_recover(in_process, warm_settings, store, capsys):
    lease_s = warm_settings.wal_lease_s
    # Begun a lease and a moment ago: its lease has run out by the real clock the CLI reads.
    wal = WalStore(store, lease_s, clock=lambda: time.time() - lease_s - 0.2)
    txn = wal.begin("plan-x", 0, "sim", owner="dead-worker")
    in_process(["wal", "status"])
    out = capsys.readouterr().out
    assert "1 open" in out and txn.txn_id in out
    in_process(["wal", "recover"])
    assert f"rolled back 1 transaction(s): {txn.txn_id}" in capsys.readouterr().out
    assert wal.state(txn.txn_id).value == "rolled_back"
