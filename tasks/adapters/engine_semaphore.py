"""A per-engine concurrency limit shared by every worker, in Redis.

Holders sit in a sorted set scored by their expiry; a holder that dies (SIGKILL) simply
expires, so a crashed worker can never leak a slot for longer than ``hold_s``. Acquire is one
Lua call (drop expired holders, count, add) so two workers can never both take the last slot.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from pipeline.errors import TransientError
from tasks.adapters import redis_keys

_ACQUIRE = """
redis.call('zremrangebyscore', KEYS[1], '-inf', ARGV[1])
if redis.call('zcard', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('zadd', KEYS[1], ARGV[3], ARGV[4]) return 1 end
return 0
"""


class EngineSemaphore:
    """At most ``limit`` holders at once for ``engine``, across all processes.

    Expiries are read and written against ``clock`` (unix seconds, ``time.time``), so a test
    steps time past a dead holder's expiry instead of sleeping it out; waiting for a slot is
    real time.
    """

    def __init__(
        self,
        client: redis.Redis,
        engine: str,
        limit: int,
        hold_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.r = client
        self.key = redis_keys.ENGINE_SEMAPHORE.format(engine=engine)
        self.limit = limit
        self.hold_s = hold_s
        self.clock = clock
        self._acquire = client.register_script(_ACQUIRE)

    def try_acquire(self, holder: str) -> bool:
        """Take a slot for ``holder`` if one is free."""
        now = self.clock()
        args: list[str | float] = [now, self.limit, now + self.hold_s, holder]
        return bool(self._acquire(keys=[self.key], args=args))

    def renew(self, holder: str) -> bool:
        """Push ``holder``'s expiry forward; False if it already expired and was dropped."""
        return bool(self.r.zadd(self.key, {holder: self.clock() + self.hold_s}, xx=True, ch=True))

    def release(self, holder: str) -> None:
        self.r.zrem(self.key, holder)

    def holders(self) -> int:
        """Live holders now."""
        return int(self.r.zcount(self.key, self.clock(), "+inf"))

    @contextmanager
    def slot(self, wait_s: float = 60.0, holder: str | None = None) -> Iterator[str]:
        """Hold a slot for the ``with`` block; waiting longer than ``wait_s`` is transient."""
        holder = holder or uuid.uuid4().hex
        deadline = time.monotonic() + wait_s
        delay = 0.005
        while not self.try_acquire(holder):
            if time.monotonic() > deadline:
                raise TransientError(f"{self.key}: no free slot after {wait_s:.0f}s")
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.2)
        try:
            yield holder
        finally:
            self.release(holder)
