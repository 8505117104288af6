"""Decoding vLLM's KV-cache event stream: events per second on one core, against the rate one
busy replica publishes.

Two steps, in one process:

1. ``--record S`` (optional): start the real vLLM CPU server with KV events on (INFO logs, no
   request logging), keep it busy for S seconds with concurrent requests of distinct prompts
   (every step stores and, once the cache is full, evicts blocks), record every PUB message,
   and measure the rate it published (events and batches per second over the busy interval).
   The recording is written to ``--stream``. Without ``--record`` the stream file is read and
   its publish rate is taken from its own batch timestamps.
2. Decode the recorded stream on this one thread for ``--seconds`` (the whole stream, again and
   again): msgspec decoding alone, and decoding plus applying to a replica's holdings (what the
   ``prewarm kv-events`` service does per batch). The ratio to the publish rate is the headroom
   of one core; the goal is at least 100x.

Run (the vLLM part under the engine lock)::

    flock /tmp/prewarm-vllm.lock python -m benchmarks.kv_decode_bench --record 60 \\
        --stream tests/data/kv-events/vllm-0.32.0-cpu-busy.frames.msgpack
    python -m benchmarks.kv_decode_bench \\
        --stream tests/data/kv-events/vllm-0.32.0-cpu-busy.frames.msgpack

``--smoke`` decodes the small capture the tests read (``SMOKE_STREAM``) for a tenth of a second
per run, with no vLLM: what the test suite runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import msgspec
import zmq

from pipeline.kv_events import KvEventDecoder
from pipeline.kv_holdings import ReplicaHoldings

#: the small stream the tests read (a quiet vLLM CPU run), for ``--smoke``
SMOKE_STREAM = (
    Path(__file__).resolve().parents[1] / "tests/data/kv-events/vllm-0.32.0-cpu.frames.msgpack"
)


def record(seconds: float, out: Path, concurrency: int = 8) -> dict:
    """Keep a real vLLM busy for ``seconds``; write its PUB messages to ``out``; its rates."""
    from benchmarks.engines.engine import SERVED_NAME
    from benchmarks.engines.kv_vllm import KvEventsVllmServer, prose
    from jobs.embedded import free_port

    work = Path(f"/tmp/prewarm-kv-bench-{int(time.time())}")
    server = KvEventsVllmServer(free_port(), work / "vllm.log", events_port=free_port(),
                                replay_port=free_port())  # fmt: skip
    frames: list[list[bytes]] = []
    stop = threading.Event()
    with server:
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(server.events_endpoint)

        def listen() -> None:
            while not stop.is_set():
                if sub.poll(100):
                    frames.append(sub.recv_multipart())

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        time.sleep(1.0)
        rng, deadline = random.Random(0), time.monotonic() + seconds

        def client(n: int) -> int:
            sent = 0
            with httpx.Client(base_url=server.url, timeout=300.0) as http:
                while time.monotonic() < deadline:
                    words = prose(rng, rng.randint(200, 900))
                    body = {"model": SERVED_NAME, "max_tokens": 16, "prompt": words}
                    http.post("/v1/completions", json=body).raise_for_status()
                    sent += 1
            return sent

        started = time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            requests = sum(pool.map(client, range(concurrency)))
        busy_s = time.monotonic() - started
        time.sleep(1.0)
        stop.set()
        listener.join()
        sub.close(linger=0)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(msgspec.msgpack.encode([{"socket": "pub", "frames": f} for f in frames]))
    events = sum(len(m.batch.events) for m in map(KvEventDecoder().decode_frames, frames) if m)
    return {"requests": requests, "busy_s": round(busy_s, 1), "batches": len(frames),
            "events": events, "events_per_s": round(events / busy_s, 1),
            "batches_per_s": round(len(frames) / busy_s, 1),
            "concurrency": concurrency}  # fmt: skip


def load(stream: Path) -> list[list[bytes]]:
    messages = msgspec.msgpack.decode(stream.read_bytes())
    return [m["frames"] for m in messages if m["socket"] == "pub"]


def stream_rate(frames: list[list[bytes]]) -> dict:
    """Publish rate from the batches' own timestamps (first to last batch)."""
    batches = [m.batch for m in map(KvEventDecoder().decode_frames, frames) if m]
    span = max(batches[-1].ts - batches[0].ts, 1e-9)
    events = sum(len(b.events) for b in batches)
    return {"batches": len(batches), "events": events, "span_s": round(span, 1),
            "events_per_s": round(events / span, 1)}  # fmt: skip


def decode_rate(frames: list[list[bytes]], seconds: float, apply: bool) -> dict:
    """Events per second this thread decodes (and, with ``apply``, applies to holdings)."""
    decoder, events, batches = KvEventDecoder(), 0, 0
    holdings = ReplicaHoldings("bench")
    started = time.process_time()
    while time.process_time() - started < seconds:
        for message in map(decoder.decode_frames, frames):
            if message is None:
                continue
            events += len(message.batch.events)
            batches += 1
            if apply:
                holdings.apply(message.batch)
    cpu_s = time.process_time() - started
    return {"events_per_cpu_s": round(events / cpu_s), "batches_per_cpu_s": round(batches / cpu_s),
            "rejects": dict(decoder.rejects)}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--stream", type=Path, help="recorded frames (msgpack)")
    parser.add_argument("--record", type=float, help="record a busy real vLLM for S seconds first")
    parser.add_argument("--seconds", type=float, default=5.0, help="CPU seconds per decode run")
    parser.add_argument("--smoke", action="store_true", help="the small capture, no vLLM")
    args = parser.parse_args(argv)
    if args.smoke:
        args.stream, args.record, args.seconds = args.stream or SMOKE_STREAM, None, 0.1
    if args.stream is None:
        parser.error("--stream is required")
    published = record(args.record, args.stream) if args.record else None
    frames = load(args.stream)
    rate = published or stream_rate(frames)
    decode = decode_rate(frames, args.seconds, apply=False)
    applied = decode_rate(frames, args.seconds, apply=True)
    result = {
        "stream": str(args.stream), "published": rate, "decode": decode,
        "decode_and_apply": applied, "cpus_in_affinity": len(os.sched_getaffinity(0)),
        "headroom_decode": round(decode["events_per_cpu_s"] / max(rate["events_per_s"], 1e-9)),
        "headroom_decode_and_apply": round(
            applied["events_per_cpu_s"] / max(rate["events_per_s"], 1e-9)
        ),
    }  # fmt: skip
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
