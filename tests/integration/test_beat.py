"""The beat schedule from configuration, and a real ``prewarm beat`` ticking on the test Redis."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from jobs.beat import DISPATCH_S, PERIODIC, beat_schedule
from tasks.settings import ScheduleSettings, Settings
from tests.conftest import REPO_ROOT, worker_env

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _configured_app(celery_app_configured):
    # beat_schedule() lists the app's tasks, which finalizes the app: it must already point
    # at the test Redis, or this process would keep sending to the default one.
    return celery_app_configured


def test_schedule_follows_the_configured_periods():
    settings = Settings(
        schedule=ScheduleSettings(poll_repos_s=7, wal_sweep_s=11, replica_watch_s=3)
    )
    schedule = beat_schedule(settings)
    assert schedule["poll-template-repos"] == {
        "task": "prewarm.events.poll_repos", "schedule": 7.0, "options": {"expires": 7.0},
    }  # fmt: skip
    assert schedule["wal-recovery-sweep"]["schedule"] == 11.0
    assert schedule["replica-watch"]["task"] == "prewarm.events.replica_watch"
    assert schedule["gate-watch"] == {
        "task": "prewarm.events.gate_watch", "schedule": 1.0, "options": {"expires": 1.0},
    }  # fmt: skip


def test_entries_without_an_installed_task_are_left_out():
    only = {"prewarm.events.replica_watch"}
    assert list(beat_schedule(Settings(), known=only)) == ["replica-watch"]
    assert {task for _, task, _ in PERIODIC} >= only


def test_the_loop_dispatches_often_and_retraining_follows_its_period():
    known = {"prewarm.loop.dispatch", "prewarm.model.retrain_engines"}
    settings = Settings(schedule=ScheduleSettings(window_s=300, retrain_s=3600))
    schedule = beat_schedule(settings, known=known)
    assert schedule["warm-loop"]["task"] == "prewarm.loop.dispatch"
    assert schedule["warm-loop"]["schedule"] == DISPATCH_S  # ticks are due once per window
    assert schedule["retrain"]["task"] == "prewarm.model.retrain_engines"
    assert schedule["retrain"]["schedule"] == 3600.0
    short = beat_schedule(Settings(schedule=ScheduleSettings(window_s=2)), known=known)
    assert short["warm-loop"]["schedule"] == 2.0
    assert "forecast" not in schedule  # predictions are made and used inside the tick


def test_real_beat_sends_a_due_task(tmp_path, broker_url, store_url):
    config = tmp_path / "prewarm.toml"
    config.write_text(
        f'data_dir = "{tmp_path}"\n[schedule]\nreplica_watch_s = 1\nwal_sweep_s = 1\n'
    )
    env = worker_env({"PREWARM_CONFIG": str(config)})
    log = tmp_path / "beat.log"
    with log.open("wb") as out:
        beat = subprocess.Popen(
            [sys.executable, "-c", "from jobs.cli import main; main(['beat'])"],
            cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120  # a loaded CI box starts Python slowly
            while "Sending due task replica-watch" not in log.read_text(errors="replace"):
                assert beat.poll() is None, log.read_text(errors="replace")
                assert time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.2)
        finally:
            beat.terminate()
            beat.wait(20)
    text = log.read_text(errors="replace")
    assert "prewarm.events.replica_watch" in text


def _start_beat(folder, env) -> tuple[subprocess.Popen, object]:
    folder.mkdir()
    log = folder / "beat.log"
    out = log.open("wb")
    beat = subprocess.Popen(
        [sys.executable, "-c", "from jobs.cli import main; main(['beat'])"],
        cwd=REPO_ROOT, env={**env, "PREWARM_LOCAL_DIR": str(folder)}, stdout=out,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    return beat, log


def test_two_beats_started_at_once_one_schedules_and_the_other_takes_over(
    tmp_path, broker_url, store_url
):
    config = tmp_path / "prewarm.toml"
    config.write_text("[schedule]\nreplica_watch_s = 1\nwal_sweep_s = 1\n")
    env = worker_env({"PREWARM_CONFIG": str(config)})
    beats = [_start_beat(tmp_path / f"host-{n}", env) for n in (1, 2)]  # no folder shared

    def sent(log) -> int:
        return log.read_text(errors="replace").count("Sending due task")

    try:
        deadline = time.monotonic() + 120
        while not any(sent(log) for _, log in beats):
            assert all(b.poll() is None for b, _ in beats)
            assert time.monotonic() < deadline, [log.read_text() for _, log in beats]
            time.sleep(0.2)
        time.sleep(6)  # both tick several times meanwhile
        counts = [sent(log) for _, log in beats]
        assert sorted(c > 0 for c in counts) == [False, True], counts  # one schedules
        holder, standby = (beats[0], beats[1]) if counts[0] else (beats[1], beats[0])
        holder[0].terminate()  # the holder's host goes: the standby takes over
        holder[0].wait(20)
        deadline = time.monotonic() + 60
        while not sent(standby[1]):
            assert time.monotonic() < deadline, standby[1].read_text(errors="replace")
            time.sleep(0.2)
    finally:
        for beat, _ in beats:
            beat.terminate()
            beat.wait(20)
