"""The beat's lease: of every ``prewarm beat`` started (two replicas of a Deployment, a beat
left running on an old VM), only the one holding the lease schedules; the others wait and take
over when it stops renewing. A beat's schedule file is its own host's, so two beats would each
send every periodic task; the lease in Redis is what they share.

The lease is one key (``redis_keys.BEAT_LEASE``) holding its owner's id, set only if absent and
expiring after ``ttl_s``; its owner renews it at every tick (a Lua check-and-extend, so a beat
never extends a lease another took after its own expired).
"""

from __future__ import annotations

import os
import socket
import uuid

import redis

from tasks.adapters import redis_keys

#: seconds a lease outlives its last renewal: three of the beat's longest sleeps between ticks
#: (5 s), so a beat that stopped is replaced within 15 s and a slow tick does not lose it
LEASE_TTL_S = 15.0

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 1
end
return redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


def owner_id() -> str:
    """This process's id as a lease owner (host, pid and a random part)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class BeatLease:
    """One beat's hold on the lease (see the module docstring)."""

    def __init__(self, store: redis.Redis, owner: str | None = None, ttl_s: float = LEASE_TTL_S):
        self.store = store
        self.owner = owner or owner_id()
        self.ttl_ms = int(ttl_s * 1000)
        self._renew = store.register_script(_RENEW)
        self._release = store.register_script(_RELEASE)

    def hold(self) -> bool:
        """Take the lease, or renew it if held; False: another beat holds it."""
        return bool(self._renew(keys=[redis_keys.BEAT_LEASE], args=[self.owner, self.ttl_ms]))

    def release(self) -> None:
        """Give the lease up (a beat that stops cleanly): another takes it at its next tick."""
        self._release(keys=[redis_keys.BEAT_LEASE], args=[self.owner])

    def holder(self) -> str | None:
        raw = self.store.get(redis_keys.BEAT_LEASE)
        return None if raw is None else raw.decode() if isinstance(raw, bytes) else str(raw)
