"""What the demo records for ``prewarm report``: engine reads and its two windows' outcomes.

The demo has no beat and no watcher, so it reads the SIMULATOR's ``/metrics`` itself (through
the replica watch's own ``observe``) at each step and every few requests, and closes two
windows — the cold replay and the replay after warming — from the simulator's vLLM-format log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pipeline.ingest import IngestOptions, ingest_paths
from pipeline.planner.plan import WarmPlan
from pipeline.window_outcome import WindowOutcome
from tasks.adapters import telemetry
from tasks.adapters.store import store_client
from tasks.services.replica_watch import observe
from tasks.services.window_close import close_window
from tasks.settings import Settings

#: Log timestamps have whole seconds: a window starts and ends a second apart from its neighbours.
LOG_RESOLUTION_S = 1.05


class DemoRecorder:
    """Engine reads and window outcomes of one demo run, into the demo's store Redis."""

    def __init__(self, settings: Settings, engine: str, log_file: Path, block_size: int) -> None:
        self.settings = settings
        self.engine = settings.engine(engine)
        self.store = store_client(settings)
        self.log_file = log_file
        self.block_size = block_size

    def sample(self) -> None:
        """Read the engine's /metrics once."""
        telemetry.record_engine_sample(self.store, self.engine.name, observe(self.engine)[1])

    def every(self, n: int, advance: Callable[[], None]) -> Callable[[], None]:
        """``advance``, plus an engine read every ``n`` calls."""
        calls = [0]

        def step() -> None:
            advance()
            calls[0] += 1
            if calls[0] % n == 0:
                self.sample()

        return step

    def boundary(self) -> float:
        """A window boundary: now, with a log-second on either side."""
        time.sleep(LOG_RESOLUTION_S)
        now = time.time()
        time.sleep(LOG_RESOLUTION_S)
        return now

    def close_window(
        self, start: float, end: float, plan: WarmPlan | None = None
    ) -> WindowOutcome | None:
        """Close ``[start, end)`` from the log (the loop's own window close), against what was
        warmed and what ``plan`` predicted."""
        records = ingest_paths(
            [self.log_file], IngestOptions(block_size=self.block_size, window="1min")
        ).records
        predicted = {item.key: item.predicted_hits for item in plan.items} if plan else None
        return close_window(self.store, self.engine.name, (start, end), records, predicted)
