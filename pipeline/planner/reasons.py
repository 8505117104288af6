"""Why a plan is made: one typed reason per plan, read by metrics, status and the report."""

from __future__ import annotations

from enum import StrEnum

from pipeline.errors import BadInputError


class PlanReason(StrEnum):
    """The trigger that asked for a plan (``WarmPlan.reason``, the ``reason`` label of
    ``prewarm_plans_total``)."""

    WINDOW = "window"
    REPLICA = "replica"
    TEMPLATE = "template"
    TRIGGER = "trigger"
    CLI = "cli"
    DEMO = "demo"


#: Every reason's name, in declaration order.
REASONS: tuple[str, ...] = tuple(reason.value for reason in PlanReason)


def plan_reason(value: str, where: str = "reason") -> PlanReason:
    """``value`` as a :class:`PlanReason`; an unknown one is bad input naming ``where``."""
    try:
        return PlanReason(value)
    except ValueError:
        raise BadInputError(
            f"unknown reason {value!r} (one of {', '.join(REASONS)})", where=where
        ) from None


def trigger_reason(kind: str) -> PlanReason:
    """The plan reason of a trigger kind: a replica that became ready or restarted
    (``replica_*``) is ``replica``; a plan reason stays itself; any other trigger (hit-rate
    drop, spike, drift) is ``trigger``."""
    if kind.startswith("replica"):
        return PlanReason.REPLICA
    return PlanReason(kind) if kind in REASONS else PlanReason.TRIGGER
