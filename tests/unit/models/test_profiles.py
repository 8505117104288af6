"""Workload profiles separate real workloads and keep their labels."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import adjusted_rand_score

from models.profiles import ProfilerNotFittedError, WorkloadProfiler
from pipeline.ingest.traces import read_azure
from tests.conftest import SHARED_DATA

TRACES = SHARED_DATA / "traces"


@pytest.fixture(scope="module")
def azure_sample() -> tuple[pd.DataFrame, np.ndarray]:
    """800 real requests of each Azure workload (code, conv), and which is which."""
    code = read_azure(TRACES / "AzureLLMInferenceTrace_code.csv").sample(800, random_state=1)
    conv = read_azure(TRACES / "AzureLLMInferenceTrace_conv.csv").sample(800, random_state=1)
    return pd.concat([code, conv], ignore_index=True), np.r_[np.zeros(800), np.ones(800)]


@pytest.fixture(scope="module")
def profiler(azure_sample) -> WorkloadProfiler:
    return WorkloadProfiler(max_profiles=5, sample=1000).fit(azure_sample[0])


def test_profiles_separate_azure_code_from_conv(azure_sample, profiler):
    records, workload = azure_sample
    labels = profiler.predict(records)
    table = pd.crosstab(labels, workload)
    purity = table.max(axis=1).sum() / table.to_numpy().sum()
    assert purity >= 0.75
    assert adjusted_rand_score(workload, labels) >= 0.3


def test_descriptions_and_one_representative_per_profile(azure_sample, profiler):
    records, _ = azure_sample
    reps = profiler.representatives(records)
    assert sorted(reps["profile"]) == sorted(set(profiler.predict(records)))
    assert all(", " in text and "output" in text for text in reps["description"])
    assert set(records.columns) <= set(reps.columns)


def test_partial_fit_keeps_labels_of_unchanged_requests(azure_sample):
    records, _ = azure_sample
    profiler = WorkloadProfiler(max_profiles=3, sample=400).fit(records.iloc[::2])
    before = profiler.predict(records)
    profiler.partial_fit(records.iloc[1::2])
    assert (profiler.predict(records) == before).mean() > 0.9


def test_refit_matches_labels_to_the_previous_profiles(azure_sample):
    records, _ = azure_sample
    profiler = WorkloadProfiler(min_profiles=3, max_profiles=3, sample=400).fit(records)
    before = profiler.predict(records)
    profiler.random_state = 7
    after = profiler.fit(records).predict(records)
    # The refit's labels agree with the old ones as well as the best relabelling could.
    table = pd.crosstab(before, after).to_numpy()
    rows, cols = linear_sum_assignment(-table)
    assert (after == before).sum() == table[rows, cols].sum()
    assert (after == before).mean() > 0.6


def test_unfitted_profiler_is_a_clear_error(azure_sample):
    with pytest.raises(ProfilerNotFittedError, match="fitted"):
        WorkloadProfiler().predict(azure_sample[0])
