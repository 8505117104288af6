"""A beat scheduler that leaves a heartbeat in Redis on every tick, and schedules only while it
holds the beat lease.

``prewarm health beat`` (the compose health check) reads the heartbeat: a beat that stopped
ticking is unhealthy even while its process is alive. Of two beats started at once (workers on
many hosts, a Deployment rolled), only the lease's holder sends periodic tasks
(:mod:`tasks.adapters.beat_lease`); the other ticks, records its heartbeat and waits.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.beat import PersistentScheduler

from pipeline.errors import PrewarmError
from tasks.adapters.beat_lease import BeatLease
from tasks.adapters.connections import ping_redis, record_beat_heartbeat
from tasks.adapters.store import StoreError, store_client
from tasks.settings import current_settings

logger = logging.getLogger(__name__)

#: Longest sleep between ticks, so the heartbeat stays fresh with an empty schedule.
MAX_TICK_S = 5.0


class HeartbeatScheduler(PersistentScheduler):
    """celery beat's persistent scheduler, plus a heartbeat key written at each tick."""

    lease: BeatLease | None = None

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self._holds_lease():
            self._beat()
            return MAX_TICK_S  # a standby: ask again before the holder's lease can expire
        interval = super().tick(*args, **kwargs)
        self._beat()
        return min(interval, MAX_TICK_S)

    def _holds_lease(self) -> bool:
        if self.lease is None:
            self.lease = BeatLease(store_client(current_settings()))
        try:
            held = self.lease.hold()
        except StoreError as exc:  # no Redis: no lease, and nothing to schedule onto either
            logger.warning("beat lease not taken: %s", exc)
            return False
        if not held:
            logger.debug("beat lease held by %s: standing by", self.lease.holder())
        return held

    def close(self) -> None:
        if self.lease is not None:
            try:
                self.lease.release()
            except StoreError as exc:  # it expires by itself
                logger.warning("beat lease not released: %s", exc)
        super().close()

    def _beat(self) -> None:
        url = current_settings().store_redis_url
        try:
            ping_redis(url, role="the Redis store", timeout_s=1.0)
            record_beat_heartbeat(url)
        except PrewarmError as exc:  # keep scheduling; the health check will report it
            logger.warning("beat heartbeat not recorded: %s", exc)
        logger.debug("beat tick at %.3f", time.time())
