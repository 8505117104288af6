"""Saved models come back identical, versioned, and refuse to load when the code moved on."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from models.baselines import EWMA, ModelNotFittedError, simple_models
from models.forecaster import HotnessForecaster
from models.persistence import (
    ModelMismatchError,
    current_version,
    list_versions,
    load_model,
    save_model,
)
from models.profiles import WorkloadProfiler
from pipeline.errors import BadInputError
from pipeline.evaluation import CountMatrix


@pytest.fixture(scope="module")
def fitted(daily_counts) -> HotnessForecaster:
    return HotnessForecaster(n_estimators=15).fit(CountMatrix.from_counts(daily_counts))


def test_forecaster_round_trip_predicts_the_same(tmp_path, fitted, daily_counts):
    folder = save_model(fitted, tmp_path, "hotness")
    assert folder.name == "v0001"
    assert sorted(p.name for p in folder.iterdir()) == [
        "booster.txt",
        "metadata.json",
        "state.json",
    ]
    loaded = load_model(tmp_path, "hotness", kind="lightgbm")
    before, after = fitted.predict_next(daily_counts), loaded.predict_next(daily_counts)
    pd.testing.assert_frame_equal(before, after)
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["feature_names"] == fitted.feature_names()
    assert meta["libraries"]["lightgbm"]
    assert meta["training_range"]["until"] == fitted.trained_until_.isoformat()
    assert meta["params"]["objective"] == "poisson"


def test_each_save_is_a_new_version_and_becomes_current(tmp_path, fitted):
    save_model(fitted, tmp_path, "hotness")
    save_model(fitted, tmp_path, "hotness")
    assert list_versions(tmp_path / "hotness") == [1, 2]
    assert current_version(tmp_path, "hotness") == "v0002"
    assert load_model(tmp_path, "hotness", version="v0001").trained_until_ == fitted.trained_until_
    assert not [p for p in (tmp_path / "hotness").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("feature_names", ["lag_0", "something_else"], "feature_names"),
        ("code_version", "0.0.1/schema-0", "code_version"),
        ("libraries", {"numpy": "1.0.0", "scikit-learn": "0.1", "lightgbm": "2.0"}, "version"),
    ],
)
def test_a_mismatched_model_is_refused_with_what_differs(tmp_path, fitted, field, value, message):
    folder = save_model(fitted, tmp_path, "hotness")
    meta_path = folder / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta[field] = value
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ModelMismatchError, match=message) as caught:
        load_model(tmp_path, "hotness")
    assert "metadata.json" in str(caught.value) and "retrain" in str(caught.value)


def test_loading_another_kind_than_asked_is_refused(tmp_path, daily_counts):
    save_model(EWMA().fit(CountMatrix.from_counts(daily_counts)), tmp_path, "hotness")
    with pytest.raises(ModelMismatchError, match="kind"):
        load_model(tmp_path, "hotness", kind="lightgbm")


@pytest.mark.parametrize("name", list(simple_models()))
def test_every_simple_candidate_the_selection_may_keep_loads_back(tmp_path, daily_counts, name):
    matrix = CountMatrix.from_counts(daily_counts)
    model = simple_models()[name].fit(matrix)
    save_model(model, tmp_path, "hotness")
    loaded = load_model(tmp_path, "hotness")
    assert type(loaded) is type(model) and loaded.get_params() == model.get_params()
    items, t = np.arange(matrix.n_items), matrix.n_windows - 1
    expected = model.predict_at(matrix, t, items)
    np.testing.assert_allclose(loaded.predict_at(matrix, t, items), expected)


def test_nothing_saved_and_unfitted_models_are_clear_errors(tmp_path):
    with pytest.raises(BadInputError, match="no saved model"):
        load_model(tmp_path, "hotness")
    with pytest.raises(ModelNotFittedError):
        save_model(HotnessForecaster(), tmp_path, "hotness")
    assert list_versions(tmp_path / "hotness") == []


def test_profiler_round_trip_keeps_labels(tmp_path):
    rng = np.random.default_rng(0)
    records = pd.DataFrame(
        {
            "ts": pd.date_range("2024-01-01", periods=400, freq="s", tz="UTC"),
            "prompt_tokens": np.r_[rng.integers(50, 100, 200), rng.integers(4000, 6000, 200)],
            "output_tokens": np.r_[rng.integers(300, 500, 200), rng.integers(5, 20, 200)],
        }
    )
    profiler = WorkloadProfiler(max_profiles=3).fit(records)
    save_model(profiler, tmp_path, "profiles")
    loaded = load_model(tmp_path, "profiles", kind="profiles")
    np.testing.assert_array_equal(loaded.predict(records), profiler.predict(records))
    assert loaded.describe() == profiler.describe()
