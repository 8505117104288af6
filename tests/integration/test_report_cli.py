"""``prewarm report`` as a user runs it: the real command against a store holding history."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from pipeline.planner.plan import PlanBudget, WarmItem, WarmPlan, new_plan_id
from pipeline.triggers import EngineSample
from tasks.adapters import telemetry
from tests.integration.processes import prewarm_script

pytestmark = pytest.mark.integration


def prewarm(*args: str, store_url: str, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    env["PREWARM_REDIS_URL"] = store_url
    return subprocess.run([prewarm_script(), *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def an_hour(store, engine: str, now: float) -> None:
    """An hour of one engine: reads every minute, a restart, a warm-up, two windows."""
    items = tuple(WarmItem("prefix", f"p{n}", "m", text="x", tokens=100) for n in range(4))
    for minute in range(60):
        ts = now - 3600 + 60 * minute
        start = ts - 3600 if minute < 30 else ts - 1800  # the engine restarted at minute 30
        hits = 10.0 * minute * (0.2 if minute < 40 else 0.9)
        sample = EngineSample(engine, ts, prefix_queries=10.0 * minute + 10, prefix_hits=hits,
                              start_time=start)  # fmt: skip
        telemetry.record_engine_sample(store, engine, sample, now=ts)
        if minute == 35:
            plan = WarmPlan(new_plan_id(), engine, items, PlanBudget(), dropped=1)
            telemetry.record_plan(store, plan, engine, reason="replica", now=ts)
            summary = {"state": "committed", "items": 4, "ok": 4, "failed": 0, "txn": "t"}
            telemetry.record_batch(store, engine, plan.plan_id, items, summary, now=ts)
    seen = ["p0", "p1", "p2", "p9"]
    observed = {"p0": 5, "p1": 5, "p9": 3, "fresh": 2}
    telemetry.record_window(store, engine, (now - 600, now - 300), observed, seen, {"p0": 4.0})


def test_report_of_an_hour_is_written_with_its_numbers(store, store_url, tmp_path):
    an_hour(store, "gpu-a", time.time())
    result = prewarm("report", "--since", "2h", "--out", "a.html", store_url=store_url,
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    html = (tmp_path / "a.html").read_text()
    assert "gpu-a" in html and html.count('src="data:image/png;base64,') == 6
    assert "warm-up (replica, 4 items)" in html and "engine restart" in html
    assert ">15<" in html  # requests in the closed window
    assert "66.7%" in html  # covered: p0 and p1 warmed before the window, 10 of 15
    # p9 was seen, never planned, and the plan cut candidates; "fresh" is new
    assert (
        '<td class="n">3</td><td class="n">0</td><td class="n">0</td><td class="n">2</td>' in html
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--since", "bogus"], "--since"),
        (["--since", "1h", "--until", "2h"], "period is empty"),
        ([], "--engine"),
    ],
)
def test_report_mistakes_are_one_line(store, store_url, tmp_path, args, fragment):
    an_hour(store, "gpu-a", time.time())
    an_hour(store, "gpu-b", time.time())  # two engines: --engine is needed
    result = prewarm("report", *args, store_url=store_url, cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
