"""Fixtures of the model tests."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.unit.models.series import counts_from_matrix, daily_series


@pytest.fixture(scope="session")
def daily_counts() -> pd.DataFrame:
    """Six days of 16 tenants with a daily pattern, as a counts table."""
    return counts_from_matrix(daily_series(), pd.Timedelta(minutes=10))
