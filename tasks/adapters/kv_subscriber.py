"""ZMQ client of one replica's KV-cache event stream: SUB for live batches, replay for gaps.

:class:`KvSubscriber` follows sequence numbers. A gap (a batch lost by a slow subscriber, or the
time this subscriber was stopped) is filled from the publisher's ROUTER replay socket; what the
replay no longer holds is counted as lost. A publisher that restarted (the sequence went back,
or the batch at the resume point is not the one seen before) is reported, so the caller can
reset what it knows of the replica. Malformed frames are counted by the decoder, never raised.

Resuming: :class:`Cursor` (the last sequence number and a digest of its payload) is what a
stopped subscriber needs to continue; the replay is asked from that sequence number, and its
first batch must be the same one, else the publisher is a new one.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import dataclass, field

import zmq
from zmq.utils.monitor import recv_monitor_message

from pipeline.errors import SettingsError
from pipeline.kv_events import (
    END_OF_REPLAY,
    KvEventDecoder,
    KvMessage,
    encode_sequence,
    sequence_number,
)


def payload_digest(payload: bytes) -> str:
    """A short digest of a batch payload (tells one publisher's batch N from another's)."""
    return hashlib.blake2b(payload, digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a subscriber stopped: the last sequence applied and its payload's digest."""

    seq: int
    digest: str


@dataclass(frozen=True, slots=True)
class Received:
    """Batches to apply, in order; ``restarted``: the publisher restarted before them."""

    messages: list[KvMessage]
    restarted: bool = False


@dataclass
class StreamCounters:
    """What the subscriber saw (for status and metrics)."""

    received: int = 0
    replayed: int = 0
    gaps: int = 0
    lost: int = 0
    restarts: int = 0
    replay_failures: int = 0
    rejects: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, int]:
        out = {k: int(v) for k, v in vars(self).items() if k != "rejects"}
        out.update({f"malformed_{k}": int(v) for k, v in self.rejects.items()})
        return out


class KvSubscriber:
    """SUB + replay client for one publisher; :meth:`receive` returns batches in order."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        topic: str = "",
        cursor: Cursor | None = None,
        replay_timeout_s: float = 2.0,
        idle_check_s: float = 5.0,
    ) -> None:
        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self.replay_timeout_s, self.idle_check_s = replay_timeout_s, idle_check_s
        self._checked_at = time.monotonic()
        self.cursor = cursor
        self.decoder = KvEventDecoder()
        self.counters = StreamCounters(rejects=self.decoder.rejects)
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        try:
            self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
            # ZMTP heartbeats: a publisher that went away without closing its connections (a
            # killed engine) is noticed within seconds and reconnected to when it is back
            self._sub.setsockopt(zmq.HEARTBEAT_IVL, 1000)
            self._sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
            self._sub.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            self._sub.connect(endpoint)
        except zmq.ZMQError as exc:
            self._sub.close(linger=0)
            raise SettingsError(f"cannot subscribe ({exc})", where=f"kv-events {endpoint}") from exc
        self._resumed = cursor is None
        self._monitor = self._sub.get_monitor_socket(zmq.EVENT_CONNECTED)
        self._connections = 0

    def close(self) -> None:
        """Close the sockets; idempotent."""
        if self._sub.closed:
            return
        self._sub.disable_monitor()
        self._monitor.close(linger=0)
        self._sub.close(linger=0)

    def _reconnected(self) -> bool:
        """Whether the SUB socket connected again since the last call (not its first connect)."""
        again = False
        while self._monitor.poll(0):
            recv_monitor_message(self._monitor)
            self._connections += 1
            again = again or self._connections > 1
        return again

    def _due_check(self) -> bool:
        """Time to ask whether the publisher is still the one we follow: the SUB socket
        reconnected, or nothing arrived for ``idle_check_s`` (an engine that restarted
        publishes nothing until it serves a request)."""
        now = time.monotonic()
        due = self._reconnected() or now - self._checked_at > self.idle_check_s
        if due:
            self._checked_at = now
        return due

    def _publisher_is_new(self) -> bool:
        """Asked on a reconnect: does the publisher still have the batch at our cursor, with the
        payload we saw? A restarted one has not (it counts from 0 again)."""
        if self.cursor is None or self.replay_endpoint is None:
            return False
        replayed, ended = self._replay_ended(self.cursor.seq, self.cursor.seq + 1)
        if not ended:  # the replay socket did not answer: cannot tell
            return False
        return not replayed or replayed[0][1] != self.cursor.digest

    def receive(self, timeout_s: float = 0.5, max_messages: int = 1000) -> list[Received]:
        """What arrived within ``timeout_s``, gaps filled in, in order: one chunk, or one more
        per publisher restart (a chunk with ``restarted`` starts with the new publisher)."""
        chunks: list[Received] = []
        if self._due_check() and self._publisher_is_new():
            self.counters.restarts += 1
            self.cursor = None
            chunks.append(Received([], restarted=True))
        if not self._sub.poll(int(timeout_s * 1000)):
            return chunks
        for _ in range(max_messages):
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._checked_at = time.monotonic()
            step = self._take(frames)
            if step.restarted or not chunks:
                chunks.append(Received(list(step.messages), step.restarted))
            else:
                chunks[-1].messages.extend(step.messages)
        return chunks

    def _take(self, frames: list[bytes]) -> Received:
        message = self.decoder.decode_frames(frames)
        if message is None:
            return Received([])
        self.counters.received += 1
        digest = payload_digest(frames[2])
        if not self._resumed:
            return self._resume(message, digest)
        if self.cursor is not None and message.seq <= self.cursor.seq:
            self.counters.restarts += 1
            return self._restart(message, digest)
        # a first batch after joining late: what the publisher still buffers comes first
        start = self.cursor.seq + 1 if self.cursor is not None else 0
        return self._gap_filled(self._replay(start, message.seq), start, message, digest)

    def _resume(self, message: KvMessage, digest: str) -> Received:
        """First batch after a start with a cursor: same publisher, or a new one?"""
        assert self.cursor is not None
        self._resumed = True
        if message.seq <= self.cursor.seq:
            self.counters.restarts += 1
            return self._restart(message, digest)
        replayed = self._replay(self.cursor.seq, message.seq)
        first = replayed[0] if replayed else None
        if first is not None and first[0].seq == self.cursor.seq and first[1] != self.cursor.digest:
            self.counters.restarts += 1
            return self._restart(message, digest)
        if first is not None and first[0].seq == self.cursor.seq:
            replayed = replayed[1:]
        return self._gap_filled(replayed, self.cursor.seq + 1, message, digest)

    def _restart(self, message: KvMessage, digest: str) -> Received:
        """A new publisher: what it published before ``message`` comes from its replay."""
        earlier = self._replay(0, message.seq) if message.seq > 0 else []
        self.cursor = None
        return Received(self._gap_filled(earlier, 0, message, digest).messages, restarted=True)

    def _gap_filled(
        self, replayed: list[tuple[KvMessage, str]], start: int, message: KvMessage, digest: str
    ) -> Received:
        """``message`` preceded by the replayed batches it was missing (``start`` onwards)."""
        wanted = [m for m, _ in replayed if start <= m.seq < message.seq]
        missing = message.seq - start
        if missing > 0:
            self.counters.gaps += 1
            self.counters.lost += missing - len(wanted)
        self.cursor = Cursor(message.seq, digest)
        return Received([*wanted, message])

    def _replay(self, start: int, end: int) -> list[tuple[KvMessage, str]]:
        """Batches ``start..end-1`` from the replay socket (what it still buffers), with digests;
        the batch at ``start`` comes first when the publisher still has it."""
        return self._replay_ended(start, end)[0]

    def _replay_ended(self, start: int, end: int) -> tuple[list[tuple[KvMessage, str]], bool]:
        """:meth:`_replay`, and whether the publisher's end marker came within the timeout."""
        if self.replay_endpoint is None or start >= end:
            return [], False
        sock = self._ctx.socket(zmq.DEALER)
        sock.connect(self.replay_endpoint)
        out: list[tuple[KvMessage, str]] = []
        deadline = time.monotonic() + self.replay_timeout_s
        try:
            sock.send_multipart((b"", encode_sequence(start)))
            while (left := deadline - time.monotonic()) > 0 and sock.poll(int(left * 1000)):
                frames = sock.recv_multipart()
                if len(frames) == 4 and _is_end(frames[2]):
                    return out, True
                message = self.decoder.decode_frames(frames[1:]) if len(frames) == 4 else None
                if message is not None and message.seq < end:
                    self.counters.replayed += 1
                    out.append((message, payload_digest(frames[3])))
            self.counters.replay_failures += 1
            return out, False
        finally:
            sock.close(linger=0)


def _is_end(frame: bytes) -> bool:
    try:
        return sequence_number(frame) == END_OF_REPLAY
    except ValueError:
        return False
