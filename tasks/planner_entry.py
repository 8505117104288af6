"""The one way every trigger asks for a plan: :func:`tasks.warm_plan.plan_for_engine`, with a
reason (``window``, ``replica``, ``template``, ``trigger``, ``cli``, ``demo``).

The reason goes to the planner on its request (:class:`pipeline.planning.PlanRequest`), which
chooses candidates by it and writes it into the plan's notes (``reason: <r>``), so a plan
always says which trigger asked for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from pipeline.errors import BadInputError
from pipeline.plan import WarmItem, WarmPlan
from pipeline.planning import REASONS, PlanRequest
from tasks import warm_plan
from tasks.settings import EngineSettings


def reason_of(plan: WarmPlan) -> str | None:
    """The reason a plan was made for, from its notes."""
    for note in plan.notes:
        if note.startswith("reason: "):
            return note[len("reason: ") :]
    return None


def plan_for(
    records: pd.DataFrame,
    request: PlanRequest,
    *,
    reason: str,
    windows: Path | None = None,
    forecast: str = "auto",
    engine: EngineSettings | None = None,
    models_root: Path | None = None,
    extra: Sequence[WarmItem] = (),
) -> WarmPlan:
    """A plan from the one planner, made for ``reason``; ``extra``: candidates the caller knows
    of (template heads, configured adapters)."""
    if reason not in REASONS:
        raise BadInputError(f"unknown plan reason {reason!r}; known: {', '.join(REASONS)}")
    request = replace(request, reason=reason)
    return warm_plan.plan_for_engine(
        records, request, windows, forecast, engine=engine, models_root=models_root, extra=extra
    )
