"""The one way every trigger asks for a plan: :func:`tasks.warm_plan.plan_for_engine`, with a
reason (``window``, ``replica``, ``template``, ``trigger``, ``cli``, ``demo``).

The reason is passed to the planner as the keyword ``reason`` when the planner takes it, and
is written into the plan's notes (``reason: <r>``) either way, so a plan always says which
trigger asked for it.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.errors import BadInputError
from pipeline.plan import WarmPlan
from pipeline.planning import PlanRequest
from tasks import warm_plan
from tasks.settings import EngineSettings

REASONS = ("window", "replica", "template", "trigger", "cli", "demo")


@lru_cache(maxsize=1)
def _planner_takes_reason() -> bool:
    return "reason" in inspect.signature(warm_plan.plan_for_engine).parameters


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
) -> WarmPlan:
    """A plan from the one planner, made for ``reason``."""
    if reason not in REASONS:
        raise BadInputError(f"unknown plan reason {reason!r}; known: {', '.join(REASONS)}")
    kwargs: dict[str, Any] = {"engine": engine, "models_root": models_root}
    if _planner_takes_reason():
        kwargs["reason"] = reason
    plan = warm_plan.plan_for_engine(records, request, windows, forecast, **kwargs)
    if reason_of(plan) is None:
        plan = replace(plan, notes=(*plan.notes, f"reason: {reason}"))
    return plan
