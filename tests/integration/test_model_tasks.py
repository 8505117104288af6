"""Model tasks through a real worker: retrain saves a version, predict ranks the next window."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.unit.models.series import counts_from_matrix, daily_series

pytestmark = pytest.mark.integration


@pytest.fixture
def counts_file(tmp_path):
    path = tmp_path / "windows.parquet"
    counts_from_matrix(daily_series(items=8, days=3), pd.Timedelta(minutes=10)).to_parquet(path)
    return path


def test_retrain_then_predict_through_a_worker(celery_worker, celery_app_configured, tmp_path,
                                               counts_file):  # fmt: skip
    data_dir = str(tmp_path / "data")
    paths = {"counts_path": str(counts_file), "data_dir": data_dir}

    def run(task: str, **kwargs: object) -> dict:
        return celery_app_configured.send_task(task, kwargs={**paths, **kwargs}).get(timeout=120)

    trained = run("prewarm.model.retrain", budget=3)
    assert trained["version"] == "v0001" and trained["reused"] is False
    meta = json.loads((tmp_path / "data/models/hotness/v0001/metadata.json").read_text())
    selection = meta["extra"]["selection"]
    assert meta["extra"]["source"] and selection["winner"] == trained["winner"]
    # the saved kind is the winner's, and every candidate's backtest row is kept with it
    table = {row["model"]: row for row in selection["table"]}
    assert meta["kind"] == table[trained["winner"]]["kind"]
    assert {"last_window", "ewma", "lightgbm_poisson"} <= set(table)
    assert selection["budgets"] == [3]

    again = run("prewarm.model.retrain", budget=3)
    assert again == {"version": "v0001", "path": trained["path"], "reused": True}

    answer = run("prewarm.model.predict", top=3)
    assert answer["items"] == 8 and len(answer["top"]) == 3
    ranking = pd.read_parquet(answer["out"])
    assert list(ranking["item_key"][:3]) == [row["item_key"] for row in answer["top"]]
    last = pd.read_parquet(counts_file)["window_start"].max()
    assert pd.Timestamp(answer["window_start"]) == last + pd.Timedelta(minutes=10)


def test_predict_without_a_model_fails_as_bad_input(celery_worker, celery_app_configured,
                                                    tmp_path, counts_file):  # fmt: skip
    result = celery_app_configured.send_task(
        "prewarm.model.predict",
        kwargs={"counts_path": str(counts_file), "data_dir": str(tmp_path / "empty")},
    )
    with pytest.raises(Exception, match="no saved model"):
        result.get(timeout=60)


def test_model_tasks_route_to_the_model_queue(celery_app_configured):
    route = celery_app_configured.amqp.router.route({}, "prewarm.model.retrain")
    assert route["queue"].name == "model"
