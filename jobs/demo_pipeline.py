"""What the demo shows of the loop's work: the records it read, the counts, the plan it made.

The demo runs prewarm's own loop (``prewarm.loop.warm`` on its embedded worker, reason
``demo``): read the simulator's log as a configured source, add it to the engine's
observations, plan with the one planner, warm through the WAL. This module only reads back what
that run left: the plan from the store, the counts from the observations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from pipeline.planner.plan import WarmPlan
from tasks.adapters.observations import Observations
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.store import Store
from tasks.settings import Settings


@dataclass(frozen=True)
class Learned:
    """What the loop learned from the log, for the printout."""

    records: int
    rejected: int
    counts: pd.DataFrame
    plan: WarmPlan


def learned_from(settings: Settings, store: Store, outcome: dict[str, Any]) -> Learned:
    """The records read, the counts kept and the plan of one loop outcome."""
    sources = outcome.get("sources") or []
    plan, _, _ = PlanStore(store).load(str(outcome["plan_id"]))
    counts = Observations(settings.data_dir, outcome["engine"]).counts()
    return Learned(
        records=sum(int(s.get("records", 0)) for s in sources),
        rejected=sum(int(s.get("rejected", 0)) for s in sources),
        counts=counts if counts is not None else pd.DataFrame(columns=["item_kind", "item_key"]),
        plan=plan,
    )
