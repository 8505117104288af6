"""The KV-event subscriber against the simulator's publisher, over real ZMQ sockets on loopback.

The simulator publishes vLLM's wire format (tagged maps, or the older tagged arrays by flag) with
a ROUTER replay socket. A subscriber stopped for a while and started again from its cursor
recovers the gap from the replay socket; a publisher that restarts is detected, whether the
subscriber was running or stopped at the time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import zmq

from jobs.embedded import free_port
from jobs.simulator import SimulatorConfig, SimulatorServer
from pipeline.kv_events import BlockStored, encode_sequence
from pipeline.kv_holdings import ReplicaHoldings
from tasks.adapters.kv_subscriber import KvSubscriber, Received

pytestmark = pytest.mark.integration
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
]


def prompt(n: int, length: int = 80) -> str:
    return " ".join(WORDS[(n * 7 + i * (n + 3)) % len(WORDS)] + str(n) for i in range(length))


@pytest.fixture(params=["map", "array"])
def sim(request: pytest.FixtureRequest) -> Iterator[SimulatorServer]:
    config = SimulatorConfig(
        block_size=16, capacity_blocks=64,
        kv_events_endpoint=f"tcp://127.0.0.1:{free_port()}",
        kv_replay_endpoint=f"tcp://127.0.0.1:{free_port()}", kv_events_form=request.param,
    )  # fmt: skip
    with SimulatorServer(config) as server:
        yield server


def subscriber(sim: SimulatorServer, **kwargs) -> KvSubscriber:
    config = sim.config
    assert config.kv_events_endpoint is not None
    return KvSubscriber(config.kv_events_endpoint, config.kv_replay_endpoint, **kwargs)


def send(sim: SimulatorServer, numbers: range) -> None:
    with httpx.Client(base_url=sim.url, timeout=10.0) as client:
        for n in numbers:
            body = {"model": "sim-llm", "prompt": prompt(n), "max_tokens": 1}
            client.post("/v1/completions", json=body).raise_for_status()


def collect(sub: KvSubscriber, count: int, timeout_s: float = 10.0) -> list[Received]:
    """Chunks until ``count`` batches arrived."""
    chunks: list[Received] = []
    deadline = time.monotonic() + timeout_s
    while sum(len(c.messages) for c in chunks) < count and time.monotonic() < deadline:
        chunks += sub.receive(timeout_s=0.2)
    return chunks


def joined(sub: KvSubscriber, sim: SimulatorServer) -> None:
    """Wait until the SUB socket receives (a ZMQ subscriber misses what precedes its join)."""
    send(sim, range(1000, 1001))
    assert collect(sub, 1), "subscriber never received a batch"


def seqs(chunks: list[Received]) -> list[int]:
    return [m.seq for c in chunks for m in c.messages]


def test_the_simulator_publishes_vllm_batches_in_its_form(sim):
    sub = subscriber(sim)
    try:
        joined(sub, sim)
        send(sim, range(3))
        chunks = collect(sub, 3)
        assert sub.decoder.form == sim.config.kv_events_form
        events = [e for c in chunks for m in c.messages for e in m.batch.events]
        stored = [e for e in events if isinstance(e, BlockStored)]
        assert len(stored) == 3 and all(e.block_size == 16 and e.medium == "GPU" for e in stored)
        assert all(len(e.token_ids) == 16 * len(e.block_hashes) for e in stored)
    finally:
        sub.close()


def test_a_stopped_subscriber_recovers_the_gap_from_the_replay_socket(sim):
    witness = subscriber(sim)  # never stopped: what a complete view holds
    first = subscriber(sim)
    try:
        joined(witness, sim)
        collect(first, 1)
        send(sim, range(2))
        seen = collect(first, 2)
        cursor = first.cursor
        first.close()  # stopped for a while: six batches go by unseen
        send(sim, range(2, 8))
        second = subscriber(sim, cursor=cursor)
        time.sleep(0.3)  # let it join before the next batch
        send(sim, range(8, 9))
        recovered = collect(second, 7)
        assert not any(c.restarted for c in recovered)
        all_seqs = seqs(seen) + seqs(recovered)
        assert all_seqs == list(range(all_seqs[0], all_seqs[0] + len(all_seqs)))
        assert second.counters.gaps == 1 and second.counters.lost == 0
        assert second.counters.replayed >= 6
        full = collect(witness, 9)
        holdings_a, holdings_b = ReplicaHoldings("a"), ReplicaHoldings("b")
        for message in [m for c in seen + recovered for m in c.messages]:
            holdings_a.apply(message.batch)
        for message in [m for c in full for m in c.messages if m.seq >= all_seqs[0]]:
            holdings_b.apply(message.batch)
        assert holdings_a.held == holdings_b.held and holdings_a.held
        second.close()
    finally:
        witness.close()


def test_a_gap_the_replay_no_longer_holds_is_counted_lost(sim):
    sub = subscriber(sim)
    try:
        joined(sub, sim)
        cursor = sub.cursor
        assert cursor is not None
        send(sim, range(3))
        # published before the blind one joins (the simulator's publisher thread sends what is
        # queued every 20 ms, so an HTTP answer can come before its batch is out)
        assert seqs(collect(sub, 3)) == [cursor.seq + 1, cursor.seq + 2, cursor.seq + 3]
        sub.close()
        blind = KvSubscriber(sim.config.kv_events_endpoint or "", None, cursor=cursor)
        time.sleep(0.3)
        send(sim, range(3, 4))
        chunks = collect(blind, 1)
        assert seqs(chunks) == [cursor.seq + 4]
        assert blind.counters.gaps == 1 and blind.counters.lost == 3
        blind.close()
    finally:
        sub.close()


def test_a_publisher_restart_is_detected_while_following(sim):
    sub = subscriber(sim)
    try:
        joined(sub, sim)
        send(sim, range(3))
        collect(sub, 3)
        sim.restart()  # a new engine process: a new publisher counting from 0 again
        chunks: list[Received] = []
        for n in range(3, 23):  # the SUB socket reconnects within its heartbeat timeout
            send(sim, range(n, n + 1))
            chunks += collect(sub, 1, timeout_s=0.5)
            if chunks:
                break
        assert chunks and chunks[0].restarted and sub.counters.restarts == 1
        # what the new publisher sent before the reconnect came from its replay socket
        assert seqs(chunks) == list(range(len(seqs(chunks))))
    finally:
        sub.close()


def test_a_publisher_restart_while_stopped_is_detected_on_resume(sim):
    sub = subscriber(sim)
    joined(sub, sim)
    send(sim, range(3))
    collect(sub, 3)
    cursor = sub.cursor
    assert cursor is not None and cursor.seq == 3
    sub.close()
    sim.restart()
    send(sim, range(10, 16))  # the new publisher passes the old cursor: seq alone cannot tell
    again = subscriber(sim, cursor=cursor)
    try:
        time.sleep(0.3)
        send(sim, range(16, 17))
        chunks = collect(again, 7)
        assert chunks[0].restarted and again.counters.restarts == 1
        assert seqs(chunks) == list(range(7))  # the new publisher's whole stream, from replay
    finally:
        again.close()


def test_malformed_frames_are_counted_never_fatal():
    port = free_port()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    sub = KvSubscriber(f"tcp://127.0.0.1:{port}")
    try:
        time.sleep(0.3)
        pub.send_multipart([b"", b"short"])
        pub.send_multipart([b"", encode_sequence(0), b"\xc1 not msgpack"])
        pub.send_multipart([b"", encode_sequence(1), b"\x93\xcb" + b"\x00" * 8 + b"\x90\x00"])
        chunks: list[Received] = []
        deadline = time.monotonic() + 5
        while sum(sub.counters.rejects.values()) < 2 and time.monotonic() < deadline:
            chunks += sub.receive(0.2)
        assert sub.counters.rejects == {"frames": 1, "payload": 1}
        assert seqs(chunks) == [1]  # the good batch after the bad ones still arrives
    finally:
        sub.close()
        pub.close(linger=0)


def test_a_publisher_restart_is_detected_before_any_new_traffic(sim):
    """An engine that restarts publishes nothing until it serves a request; the reconnect of
    the SUB socket is the cue to ask the replay socket whether the publisher is a new one."""
    sub = subscriber(sim)
    try:
        joined(sub, sim)
        send(sim, range(2))
        collect(sub, 2)
        assert sub.counters.restarts == 0
        sim.restart()
        chunks: list[Received] = []
        deadline = time.monotonic() + 15
        while not chunks and time.monotonic() < deadline:
            chunks = sub.receive(timeout_s=0.2)
        assert chunks and chunks[0].restarted and not chunks[0].messages
        assert sub.counters.restarts == 1
    finally:
        sub.close()
