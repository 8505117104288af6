"""The gate: a replica takes traffic only once prewarm has warmed it.

A gated replica (a fleet with ``gate = true``) lives through one *episode* per engine process:

- ``waiting`` — it answers and is new (scale-out, a new address) or restarted (another process
  start time): it is out of the router's worker list (removed first), its readiness answer is
  503, and its hot set is warmed directly on its own URL;
- ``ready`` — every item of that warm-up is verified held on the replica: it is added to the
  router's list, its readiness answer is 200;
- ``admitted_cold`` — the deadline (``gate_deadline_s``) passed first: it is admitted anyway
  (a gate never blocks forever), with a WARNING, a counter and a degraded status;
- ``down`` — it stopped answering: out of the router's list until its next episode.

Time to ready is split into prewarm's own part (detection, planning, dispatch, verification)
and the warm-up's run on the engine (``warm``: the engine's prefill of the hot set, with the
few milliseconds of sending it). This module is pure: the states, the readiness answer, the
deadline; :mod:`tasks.services.gate` looks at replicas and edits routers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any


class GateState(StrEnum):
    """Where a gated replica stands in its episode."""

    WAITING = "waiting"
    READY = "ready"
    ADMITTED_COLD = "admitted_cold"
    DOWN = "down"


#: the stages of time to ready, in order; prewarm's own part is every one but ``warm``
STAGES = ("detection", "planning", "dispatch", "warm", "verification")
PREWARM_STAGES = ("detection", "planning", "dispatch", "verification")


@dataclass(frozen=True)
class GateRecord:
    """One replica's episode: its engine process (``start_time``), its state, when it was
    first seen answering (``detected``), the warm-up's plan, the seconds of each stage, and
    when it was admitted."""

    fleet: str
    engine: str
    url: str
    state: GateState
    detected: float
    start_time: float | None = None
    plan_id: str | None = None
    stages: dict[str, float] = field(default_factory=dict)
    admitted: float | None = None
    why: str = ""
    tries: int = 0
    #: when its last warm-up was planned (a failed one is tried again a little later)
    tried_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "state": self.state.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GateRecord:
        return cls(**{**data, "state": GateState(data["state"])})

    @property
    def admits(self) -> bool:
        """Whether the replica takes traffic (in the router's list, Ready)."""
        return self.state in (GateState.READY, GateState.ADMITTED_COLD)

    @property
    def time_to_ready(self) -> float | None:
        """Seconds from detection to admission (None: not admitted)."""
        return None if self.admitted is None else self.admitted - self.detected

    def prewarm_part(self) -> float:
        """Seconds of prewarm's own stages."""
        return sum(self.stages.get(stage, 0.0) for stage in PREWARM_STAGES)

    def with_stage(self, stage: str, seconds: float) -> GateRecord:
        """The record with ``seconds`` added to ``stage``."""
        stages = {**self.stages, stage: round(self.stages.get(stage, 0.0) + seconds, 6)}
        return replace(self, stages=stages)


def new_episode(
    fleet: str, engine: str, url: str, now: float, start_time: float | None
) -> GateRecord:
    """A replica just seen answering as a new engine process: waiting."""
    return GateRecord(fleet, engine, url, GateState.WAITING, now, start_time)


def is_new_process(last: GateRecord | None, start_time: float | None) -> bool:
    """Whether a replica answering with ``start_time`` begins a new episode after ``last``: it
    was never seen, was down, or another process answers now (a restart between two looks)."""
    if last is None or last.state == GateState.DOWN:
        return True
    return start_time is not None and last.start_time is not None and start_time != last.start_time


def past_deadline(record: GateRecord, now: float, deadline_s: float) -> bool:
    """Whether a waiting replica has waited ``deadline_s`` or longer."""
    return record.state == GateState.WAITING and now - record.detected >= deadline_s


def admitted(record: GateRecord, state: GateState, now: float, why: str) -> GateRecord:
    """The record of a replica admitted at ``now`` (``ready``, or ``admitted_cold``)."""
    return replace(record, state=state, admitted=now, why=why)


def readiness(record: GateRecord | None, now: float, deadline_s: float) -> tuple[int, str]:
    """A readiness probe's answer for a replica: 200 once it is admitted (or its deadline
    passed, whoever looks first), 503 before — and for a replica the gate has not seen."""
    if record is None:
        return 503, "not seen by the gate yet"
    if record.admits:
        return 200, record.state.value
    if past_deadline(record, now, deadline_s):
        return 200, f"{GateState.ADMITTED_COLD.value}: deadline of {deadline_s:g}s passed"
    return 503, f"{record.state.value} for {now - record.detected:.1f}s"
