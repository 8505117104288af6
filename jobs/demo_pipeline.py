"""The demo's learning step: the simulator's log → records → counts → a budgeted plan.

Every step is prewarm's real one (ingest, item × window counts, the planner from records); the
forecast is the simple frequency one: an EWMA over the windows the counts show per prefix.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pipeline.ingest import IngestOptions, ingest_paths
from pipeline.plan import EngineCost, PlanBudget, WarmPlan
from pipeline.planning import PlanRequest, plan_from_records
from pipeline.prefixes import frequency_forecast
from pipeline.windows import item_window_counts


@dataclass(frozen=True)
class Learned:
    """What the demo learned from the log, for the printout."""

    records: int
    rejected: int
    counts: pd.DataFrame
    plan: WarmPlan


def forecast_from_counts(counts: pd.DataFrame, keys: Iterable[str]) -> dict[str, float]:
    """Next-window requests per prefix key: the frequency EWMA over its windows in ``counts``."""
    prefixes = counts[counts["item_kind"] == "prefix"]
    wanted = prefixes[prefixes["item_key"].isin(set(keys))]
    forecast: dict[str, float] = {}
    for key, rows in wanted.groupby("item_key"):
        starts = pd.to_datetime(rows["window_start"], utc=True)
        indices = (starts.astype("int64") // 10**9 // 60).astype(int)  # one-minute windows
        forecast[str(key)] = frequency_forecast(dict(zip(indices, rows["requests"], strict=True)))
    return forecast


def learn_plan(
    log_file: Path, engine: str, model: str, budget: PlanBudget, cost: EngineCost, block_size: int
) -> Learned:
    """Ingest ``log_file`` and plan the warm-up of its shared prefixes for ``engine``."""
    result = ingest_paths(
        [log_file], IngestOptions(block_size=block_size, model=model, window="1min")
    )
    counts = item_window_counts(result.records, window="1min")
    forecast = forecast_from_counts(counts, counts["item_key"][counts["item_kind"] == "prefix"])
    request = PlanRequest(
        engine, model, budget, cost, min_count=2, window_s=60, block_size=block_size
    )
    plan = plan_from_records(result.records, request, forecast)
    rejected = int(result.summary_dict()["rejected"])
    return Learned(len(result.records), rejected, counts, plan)
