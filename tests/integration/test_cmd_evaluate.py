"""``prewarm evaluate`` on a slice of the real Mooncake trace and on a counts file."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import REPO_ROOT, SHARED_DATA, worker_env
from tests.unit.models.series import counts_from_matrix, daily_series

MOONCAKE = SHARED_DATA / "traces" / "conversation_trace.jsonl"


def prewarm(*args: str) -> subprocess.CompletedProcess[str]:
    code = "from jobs.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO_ROOT, env=worker_env(),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def mooncake_slice(tmp_path_factory):
    """The first 800 requests (about 4 minutes) of the Mooncake conversation trace."""
    path = tmp_path_factory.mktemp("trace") / "conversation_trace.jsonl"
    with MOONCAKE.open() as source:
        path.write_text("".join(next(source) for _ in range(800)))
    return path


def test_evaluate_prints_every_model_and_budget_as_json_and_plots(mooncake_slice, tmp_path):
    plot = tmp_path / "steps.png"
    options = ["--window", "30s", "--budget", "10", "--budget", "50", "--refit-every", "10"]
    done = prewarm("evaluate", str(mooncake_slice), *options, "--json", "--plot", str(plot))
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    table = pd.DataFrame(payload["table"])
    assert set(table["budget"]) == {"10 items", "50 items"}
    assert set(table["model"]) == {
        "last_window", "moving_average", "ewma", "frequency", "seasonal_naive", "lightgbm",
        "selected",
    }  # fmt: skip
    assert payload["notes"] and payload["notes"][0].startswith("selected by backtest at each of")
    selection = payload["selection"]  # the table the last refit chose from, and the margin
    assert selection["winner"] in {row["model"] for row in selection["table"]}
    assert {"share 10 items", "share 50 items", "mae", "shortfall"} <= set(selection["table"][0])
    assert set(selection["margin"]["share"]) == {"10 items", "50 items"}
    held_out = pd.DataFrame(payload["held_out"])  # the held-out margin in its own noise
    assert list(held_out["budget"]) == ["10 items", "50 items"]
    assert (held_out["se"] >= 0).all()
    assert (held_out["bound"] <= -1.0).all()  # one point, and two standard errors below it
    assert list(held_out["holds"]) == list(held_out["share_ok"] & held_out["mae_ok"])
    assert (table["captured_share"] <= table["history_oracle_share"] + 1e-12).all()
    assert (table["history_oracle_share"] <= table["oracle_share"] + 1e-12).all()
    assert (table["mae"] >= 0).all()
    assert plot.stat().st_size > 1000


def run_in_process(capsys, *args: str) -> tuple[int, str, str]:
    """``prewarm ARGS`` in this process (no interpreter start-up): exit code, stdout, stderr."""
    from jobs.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_evaluate_reads_an_ingest_folder_and_prints_a_table(tmp_path, capsys):
    path = tmp_path / "counts.parquet"
    counts_from_matrix(daily_series(items=6, days=2), pd.Timedelta(minutes=10)).to_parquet(path)
    options = ["--window", "20min", "--budget", "2", "--refit-every", "50"]
    code, out, err = run_in_process(capsys, "evaluate", str(tmp_path), *options)
    assert code == 0, err
    assert "lightgbm" in out and "of history oracle" in out
    assert "selected by backtest at each of" in out
    assert "origins, winner" in out and "margin of" in out and "over the best baseline" in out
    assert "held out: selected vs the best baseline" in out and "2 items" in out
    assert "holds" in out or "FAILS" in out
    assert "6 items x 144 windows of 20min" in out


def test_evaluate_refuses_a_window_it_cannot_make(tmp_path, capsys):
    path = tmp_path / "windows.parquet"
    counts_from_matrix(daily_series(items=2, days=1), pd.Timedelta(minutes=10)).to_parquet(path)
    code, _, err = run_in_process(capsys, "evaluate", str(path), "--window", "5min")
    assert code == 2
    assert "bad input" in err and "cannot turn" in err
