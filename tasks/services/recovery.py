"""Plans whose worker died: found by the recovery sweep and sent to the workers again.

A batch message is acknowledged late, so a worker killed whole (main process and pool) takes
its unacknowledged message with it until the broker's visibility timeout; an ordered plan is
a chain, and the rest of the chain travels in that message. The sweep does not wait for the
broker: after it has rolled back the expired transactions, every open plan that has batches
left, none claimed, no live transaction and no sign of life for one WAL lease is re-queued from
its first unfinished batch — as a chain when the plan is ordered, as a chord otherwise. Batches
are idempotent by (plan, batch), so a late redelivery of the lost message finds them done.

A plan is also left alone while its queue still holds waiting messages: its next batch may be
among them, and sending it again would only double the backlog.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.wal import batches_to_resume, is_stalled
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.wal_store import WalStore

#: Send ``batches`` of a plan (ordered: as a chain) to ``queue`` (None: the default route).
Dispatch = Callable[[str, list[int], bool, str | None], None]
DEFAULT_QUEUE = "warm"


class PlanResumer:
    """Re-queues stalled plans; ``stall_s`` is how long a plan may show no sign of life."""

    def __init__(
        self,
        plans: PlanStore,
        wal: WalStore,
        dispatch: Dispatch,
        waiting: Callable[[str], int],
        stall_s: float,
    ) -> None:
        self.plans, self.wal, self.dispatch = plans, wal, dispatch
        self.waiting, self.stall_s = waiting, stall_s

    def resume_stalled(self, now: float) -> list[dict[str, Any]]:
        """Re-queue every stalled plan; returns what was resumed (plan, from batch, batches)."""
        resumed = []
        for plan_id in self.plans.open_plans():
            found = self._resume(plan_id, now)
            if found is not None:
                resumed.append(found)
        return resumed

    def _resume(self, plan_id: str, now: float) -> dict[str, Any] | None:
        progress = self.plans.progress(plan_id, lambda txn: self.wal.is_live(txn, now))
        if progress is None:
            self.plans.forget(plan_id)  # expired
            return None
        if len(progress.done) >= progress.batches:
            self.plans.mark_finished(plan_id)  # its chord/chain callback was lost
            return None
        if not is_stalled(progress, now, self.stall_s):
            return None
        options, queue = self.plans.route(plan_id)
        if self.waiting(queue or DEFAULT_QUEUE) or not self.plans.claim_resume(
            plan_id, self.stall_s
        ):
            return None
        batches = batches_to_resume(progress)
        self.dispatch(plan_id, batches, options.ordered, queue)
        self.plans.note_resumed(plan_id, batches)
        return {"plan": plan_id, "from_batch": batches[0], "batches": len(batches)}
