"""``prewarm demo`` end to end, as a user runs it: the console script, its own embedded Redis,
the simulator and a real Celery worker subprocess."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.integration.processes import prewarm_script

pytestmark = pytest.mark.integration


def test_demo_warms_every_template_and_cuts_first_use_ttft(tmp_path):
    report_file = tmp_path / "demo.json"
    args = ["demo", "--templates", "2", "--questions", "3", "--workdir", str(tmp_path / "run"),
            "--report-json", str(report_file)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    # about half a minute on a quiet machine; a 2-core machine shared by many jobs takes longer
    result = subprocess.run([prewarm_script(), *args], env=env, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "SIMULATED" in result.stdout and "SIMULATOR" in result.stdout
    report = json.loads(report_file.read_text())
    cold, warmed = report["first_use"]["cold"], report["first_use"]["warmed"]
    assert set(cold) == set(warmed) and len(cold) == 2
    assert all(entry["cached_tokens"] == 0 for entry in cold.values())
    for name, entry in warmed.items():
        # The warmed prefix covers the whole system prompt: all but the question's blocks.
        assert entry["cached_tokens"] >= 0.8 * entry["prompt_tokens"], name
    assert report["warm_report"]["items_ok"] == len(report["plan_items"]) == 2  # one per template
    assert report["warm_report"]["rolled_back"] == 0
    median = report["median_first_use_ttft_s"]
    assert median["warmed"] < median["cold"]
    assert report["records"] == 6  # one record per replayed request of the cold run
    engine_log = (tmp_path / "run" / "engine.log").read_text()
    assert "prewarm engine SIMULATOR" in engine_log
    worker_log = (tmp_path / "run" / "worker.log").read_text()
    assert "prewarm.warm.batch" in worker_log  # the real worker ran the warm-up tasks
    assert "prewarm.loop.warm" in worker_log  # ... and the loop that read the log and planned
    assert "reason: demo" in report["plan_notes"]
