"""The simulator's KV-cache event stream, in vLLM's wire format (``pipeline.kv_events``).

Like vLLM's ``ZmqEventPublisher``: a PUB socket sends ``[topic, seq (8 bytes big-endian),
payload]`` per batch, sequence numbers from 0; a ROUTER socket answers ``[b"", start_seq]`` with
every buffered batch from ``start_seq`` and an end marker of sequence -1. ``form`` chooses the
tagged-map encoding (current vLLM) or the older tagged arrays. One thread owns both sockets (ZMQ
sockets are not thread-safe); the engine hands it batches through a queue.

The engine's chain hashes are strings; on the wire a block hash is a 64-bit int, as vLLM's
default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) sends it.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence

import zmq

from pipeline.kv_events import (
    END_OF_REPLAY,
    MEDIUM_GPU,
    AllBlocksCleared,
    AnyEvent,
    BlockRemoved,
    BlockStored,
    EventBatch,
    WireForm,
    encode_batch,
    encode_sequence,
)

#: Batches kept for replay (vLLM's ``buffer_steps`` default).
BUFFER_STEPS = 10_000


def wire_hash(chain_hash: str) -> int:
    """The 64-bit int a simulator block hash is published as."""
    return int.from_bytes(hashlib.blake2b(chain_hash.encode(), digest_size=8).digest(), "big")


def stored_event(
    chain: Sequence[str],
    token_ids: Sequence[int],
    start: int,
    end: int,
    block_size: int,
    adapter: tuple[str, int] | None = None,
    salt: str | None = None,
) -> BlockStored:
    """``BlockStored`` for blocks ``start..end-1`` of ``chain``, as vLLM describes new blocks:
    the LoRA name in every block's extra keys, the cache salt in the first block's."""
    extra: list[tuple[object, ...] | None] = []
    for i in range(start, end):
        keys: tuple[str, ...] = (adapter[0],) if adapter else ()
        keys += (salt,) if salt and i == 0 else ()
        extra.append(keys or None)
    return BlockStored(
        block_hashes=[wire_hash(h) for h in chain[start:end]],
        parent_block_hash=wire_hash(chain[start - 1]) if start else None,
        token_ids=list(token_ids[start * block_size : end * block_size]),
        block_size=block_size,
        lora_id=adapter[1] if adapter else None,
        medium=MEDIUM_GPU,
        lora_name=adapter[0] if adapter else None,
        extra_keys=extra if any(e is not None for e in extra) else None,
    )


def removed_event(chain_hashes: Sequence[str]) -> BlockRemoved:
    """``BlockRemoved`` for evicted blocks."""
    return BlockRemoved(block_hashes=[wire_hash(h) for h in chain_hashes], medium=MEDIUM_GPU)


def _bound(sock: zmq.Socket[bytes], endpoint: str, wait_s: float = 3.0) -> zmq.Socket[bytes]:
    """``sock`` bound to ``endpoint``; a restarted simulator waits (up to ``wait_s``) for its
    predecessor's sockets, which ZMQ closes in the background, to let go of the port."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            sock.bind(endpoint)
            return sock
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                sock.close(linger=0)
                raise
            time.sleep(0.05)


class KvEventPublisher:
    """PUB + ROUTER replay on a background thread; :meth:`publish` queues one batch."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        form: WireForm = "map",
        topic: str = "",
        buffer_steps: int = BUFFER_STEPS,
    ) -> None:
        self.form: WireForm = form
        self.topic = topic.encode()
        self._queue: queue.Queue[EventBatch | None] = queue.Queue()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        # a context of its own, terminated on close: every connection of this publisher ends
        # with it, as when an engine process exits
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._pub = _bound(self._ctx.socket(zmq.PUB), endpoint)
        self._replay: zmq.Socket[bytes] | None = None
        if replay_endpoint is not None:
            self._replay = _bound(self._ctx.socket(zmq.ROUTER), replay_endpoint)
        self.published = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name="kv-publisher")
        self._thread.start()

    def publish(self, events: list[AnyEvent]) -> None:
        """Queue one batch (one scheduler step) stamped with the wall clock, as vLLM does."""
        if events:
            self._queue.put(EventBatch(time.time(), events, 0))

    def cleared(self) -> None:
        """Publish ``AllBlocksCleared`` (the cache was reset)."""
        self.publish([AllBlocksCleared()])

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued, stop the thread and close both sockets (their ports free)."""
        self._queue.put(None)
        self._thread.join(timeout)
        self._ctx.term()

    def _run(self) -> None:
        try:
            while True:
                if self._replay is not None and self._replay.poll(0):
                    self._serve_replay()
                try:
                    batch = self._queue.get(timeout=0.02)
                except queue.Empty:
                    continue
                if batch is None:
                    return
                self._send(batch)
        finally:
            self._pub.close(linger=200)
            if self._replay is not None:
                self._replay.close(linger=0)

    def _send(self, batch: EventBatch) -> None:
        seq, payload = self.published, encode_batch(batch, self.form)
        self._pub.send_multipart((self.topic, encode_sequence(seq), payload))
        self._buffer.append((seq, payload))
        self.published += 1

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            return  # vLLM logs and ignores a malformed replay request
        client, _, start_frame = frames
        start = int.from_bytes(start_frame, "big", signed=True)
        for seq, payload in list(self._buffer):
            if seq >= start:
                self._replay.send_multipart(
                    (client, b"", self.topic, encode_sequence(seq), payload)
                )
        self._replay.send_multipart((client, b"", b"", encode_sequence(END_OF_REPLAY), b""))
