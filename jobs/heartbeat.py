"""A beat scheduler that leaves a heartbeat in Redis on every tick.

``prewarm health beat`` (the compose health check) reads it: a beat that stopped ticking is
unhealthy even while its process is alive.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.beat import PersistentScheduler

from pipeline.errors import PrewarmError
from tasks.adapters.connections import ping_redis, record_beat_heartbeat
from tasks.settings import current_settings

logger = logging.getLogger(__name__)

#: Longest sleep between ticks, so the heartbeat stays fresh with an empty schedule.
MAX_TICK_S = 5.0


class HeartbeatScheduler(PersistentScheduler):
    """celery beat's persistent scheduler, plus a heartbeat key written at each tick."""

    def tick(self, *args: Any, **kwargs: Any) -> float:
        interval = super().tick(*args, **kwargs)
        self._beat()
        return min(interval, MAX_TICK_S)

    def _beat(self) -> None:
        url = current_settings().store_redis_url
        try:
            ping_redis(url, role="the Redis store", timeout_s=1.0)
            record_beat_heartbeat(url)
        except PrewarmError as exc:  # keep scheduling; the health check will report it
            logger.warning("beat heartbeat not recorded: %s", exc)
        logger.debug("beat tick at %.3f", time.time())
