"""The planner's fallback estimate is a model the backtest scores: ``FrequencyEstimate`` predicts
what :func:`pipeline.shared_prefixes.frequency_hits` gives a plan, item by item."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from models.baselines import FrequencyEstimate, baselines
from models.selection import candidate_models
from pipeline.evaluation import CountMatrix
from pipeline.shared_prefixes import frequency_hits
from tests.unit.models.series import counts_from_matrix

WINDOW = pd.Timedelta(minutes=5)


@settings(max_examples=60, deadline=None)
@given(
    arrays(np.int64, st.tuples(st.integers(1, 6), st.integers(2, 12)), elements=st.integers(0, 9)),
    st.data(),
)
def test_the_model_predicts_the_planners_frequency_estimate(requests, data):
    requests[:, 0] += 1  # every window of the grid starts the history at window 0
    requests[0, -1] += 1  # ... and the last one ends it
    matrix = CountMatrix.from_counts(counts_from_matrix(requests, WINDOW), window=WINDOW)
    t = data.draw(st.integers(0, matrix.n_windows - 1))
    items = np.arange(len(matrix.items))
    predicted = FrequencyEstimate().fit(matrix).predict_at(matrix, t, items)
    rows = {key: i for i, key in enumerate(matrix.items["item_key"])}
    for key, row in rows.items():
        source = int(key.rsplit("-", 1)[1])
        windows = {w: int(n) for w, n in enumerate(requests[source, : t + 1]) if n}
        expected = frequency_hits(windows, span=(0, t))
        assert predicted[row] == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_the_backtest_scores_it_and_evaluate_reports_it():
    assert "frequency" in candidate_models(learning=False)
    assert isinstance(baselines()["frequency"], FrequencyEstimate)
