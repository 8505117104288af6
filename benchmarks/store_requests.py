"""What a tick costs the shared store: per tick and engine, the object-store requests and the
bytes read and written, ``data_dir`` on a local folder against ``data_dir`` on S3 (moto's server
over HTTP on loopback), for 1, 8 and 32 engines.

    python benchmarks/store_requests.py [--redis redis://127.0.0.1:6379] [--db 12]
        [--engines 1,8,32] [--ticks 4] [--smoke]

Each engine has a JSONL request log of its own that grows by one window of requests before each
tick; every engine's window tick runs through the real loop (``WarmLoop.tick``: read the new
requests, add them to the observations, check out the models, plan) with plans submitted to a
no-op (warm-ups touch no shared state), and the engines are answered by one simulator. The
store's own counter (:class:`tasks.adapters.shared_store.RequestCounts`) gives requests by kind
and bytes; on S3 the HTTP requests moto's server answered are counted as well (s3fs sends a
``HEAD`` before some ``GET``\\s). The first tick of each engine (nothing observed yet) is left
out of the means. The requests per tick and engine should stay flat as engines are added.
``--smoke`` runs 1 and 2 engines for 3 ticks.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.embedded import free_port
from jobs.simulator import SimulatorConfig, SimulatorServer
from tasks.adapters.shared_store import forget_stores, shared_store
from tasks.services.loop import WarmLoop
from tasks.settings import (
    EngineSettings,
    LoopSettings,
    ScheduleSettings,
    Settings,
    SourceSettings,
)

WINDOW_S = 60
START = 1_800_000_000.0
PREFIXES = [f"You are assistant {n} of the Acme help desk. Answer briefly. " * 6 for n in range(6)]


class HttpRequests(logging.Handler):
    """Counts the HTTP requests moto's server logs (one line per request answered)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if '"' in record.getMessage():
            self.count += 1


def write_window(log: Path, tick: int, requests: int) -> None:
    """One window of requests for ``tick`` appended to an engine's JSONL log."""
    ts = START + tick * WINDOW_S - WINDOW_S / 2
    with log.open("a") as out:
        for n in range(requests):
            prompt = PREFIXES[n % len(PREFIXES)] + f"question {tick}-{n}"
            out.write(json.dumps({"ts": ts + n * 0.01, "prompt": prompt}) + "\n")


def settings_for(
    args: argparse.Namespace, data_dir: str, folder: Path, sim: str, n: int
) -> Settings:
    engines = tuple(EngineSettings(name=f"e{i}", url=sim, model="sim-llm", kind="simulator")
                    for i in range(n))  # fmt: skip
    sources = tuple(SourceSettings(engine=f"e{i}", kind="jsonl", path=str(folder / f"e{i}.jsonl"))
                    for i in range(n))  # fmt: skip
    store = f"{args.redis}/{args.db}"
    return Settings(redis_url=store, store_url=store, data_dir=data_dir, local_dir=folder / "local",
                    engines=engines, sources=sources, schedule=ScheduleSettings(window_s=WINDOW_S),
                    loop=LoopSettings(min_windows_for_model=1000))  # fmt: skip


def run_backend(
    args: argparse.Namespace, backend: str, engines: int, sim: str, http: HttpRequests | None
) -> dict[str, Any]:
    """Ticks of ``engines`` engines on one backend; per tick and engine means."""
    with tempfile.TemporaryDirectory(prefix="store-bench-") as tmp:
        folder = Path(tmp)
        data_dir = (
            str(folder / "data") if backend == "local" else f"s3://{args.bucket}/{folder.name}"
        )
        settings = settings_for(args, data_dir, folder, sim, engines)
        store = redis.Redis.from_url(settings.store_redis_url)
        store.flushdb()
        loop = WarmLoop(settings, store, submit=lambda plan, engine: str(plan.plan_id))
        counts = shared_store(data_dir).counts
        rows = []
        for tick in range(args.ticks):
            for i in range(engines):
                write_window(folder / f"e{i}.jsonl", tick, args.requests)
                counts.reset()
                before = http.count if http else 0
                outcome = loop.tick(f"e{i}", now=START + tick * WINDOW_S)
                assert outcome is not None, f"e{i} tick {tick} did not run"
                done = counts.snapshot()
                if tick > 0:
                    rows.append({"requests": done["total"], "bytes_read": done["bytes_read"],
                                 "bytes_written": done["bytes_written"],
                                 "http": (http.count - before) if http else None,
                                 "kinds": done["requests"]})  # fmt: skip
        return {
            "backend": backend, "engines": engines,
            "requests": round(mean(r["requests"] for r in rows), 2),
            "http_requests": round(mean(r["http"] for r in rows), 2) if http else None,
            "bytes_read": round(mean(r["bytes_read"] for r in rows)),
            "bytes_written": round(mean(r["bytes_written"] for r in rows)),
            "kinds": rows[-1]["kinds"],
        }  # fmt: skip


def start_s3(bucket: str) -> tuple[Any, HttpRequests]:
    """moto's S3 server on a free port with ``bucket``; its endpoint in this process's env."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
    forget_stores()
    shared_store(f"s3://{bucket}/probe").check(create=True)
    http = HttpRequests()
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.addHandler(http)
    werkzeug.setLevel(logging.INFO)
    werkzeug.propagate = False  # counted, not printed
    return server, http


def table(results: list[dict[str, Any]]) -> str:
    head = "engines | backend | requests/tick/engine | HTTP requests | bytes read | bytes written"
    lines = [head, "---|---|---|---|---|---"]
    for r in results:
        http = "-" if r["http_requests"] is None else r["http_requests"]
        lines.append(f"{r['engines']} | {r['backend']} | {r['requests']} | {http} | "
                     f"{r['bytes_read']} | {r['bytes_written']}")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--db", type=int, default=12)
    parser.add_argument("--engines", default="1,8,32")
    parser.add_argument("--ticks", type=int, default=4)
    parser.add_argument("--requests", type=int, default=60, help="requests per window and engine")
    parser.add_argument("--bucket", default="prewarm-bench")
    parser.add_argument("--smoke", action="store_true", help="1 and 2 engines, 3 ticks")
    args = parser.parse_args()
    if args.smoke:
        args.engines, args.ticks, args.requests = "1,2", 3, 12
    logging.basicConfig(level=logging.WARNING)
    server, http = start_s3(args.bucket)
    results = []
    started = time.monotonic()
    try:
        with SimulatorServer(SimulatorConfig()) as sim:
            for engines in (int(n) for n in args.engines.split(",")):
                for backend in ("local", "s3"):
                    results.append(run_backend(args, backend, engines, sim.url,
                                               http if backend == "s3" else None))  # fmt: skip
    finally:
        server.stop()
    print(table(results))
    print(json.dumps({"results": results, "ticks": args.ticks, "requests": args.requests,
                      "seconds": round(time.monotonic() - started, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
