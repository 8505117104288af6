"""What a fleet costs the loop as it grows: 4, 16 and 64 simulated replicas behind one router.

For each size, the replicas run as simulator servers in one process of their own (so this
process's CPU time is prewarm's alone), behind the real ``vllm-router`` (``--policy``,
``round_robin`` by default); the fleet takes its replicas from the router's worker list, each
replica's log its source. Each tick, users send ``--requests-per-replica`` chats per replica
through the router (``--templates`` templates), the replica watch looks at the fleet once, then
every replica's window tick runs here — read its log, observe, plan (the fleet's road), and its
plan's batches through the real batch runner (WAL, prime, verify, commit). Reported per size:
worker CPU seconds (``time.process_time``) per tick per replica, the median over ticks after
the first; the store's keys (``DBSIZE``) and their bytes (``MEMORY USAGE`` summed) after the
last tick.

Usage::

    python benchmarks/fleet_scale.py [--sizes 4 16 64] [--ticks 3] [--policy round_robin]
        [--redis redis://127.0.0.1:6379] [--db 12] [--json FILE] [--smoke]

``--smoke`` runs two replicas for two ticks. Flushes Redis database ``db``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from benchmarks.stack import in_process_submitter as in_process
from jobs.embedded import free_port
from tasks.services.fleets import look_at_fleets
from tasks.services.loop import WarmLoop
from tasks.settings import ScheduleSettings, Settings
from tasks.settings.fleets import FleetSettings

WINDOW_S = 60


def serve_simulators(count: int, folder: Path) -> None:
    """(The replicas' process.) Serve ``count`` simulators; print their ports, one line."""
    from jobs.simulator import SimulatorConfig, SimulatorServer

    servers = []
    for _ in range(count):
        port = free_port()
        config = SimulatorConfig(log_file=folder / f"replica-{port}.log", stats_interval_s=3600)
        servers.append(SimulatorServer(config, port=port).start())
    print(json.dumps([s.port for s in servers]), flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin


def start_replicas(count: int, folder: Path) -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-simulators", str(count), "--folder", str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


def start_router(ports: list[int], policy: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    binary = shutil.which("vllm-router") or str(Path(sys.executable).with_name("vllm-router"))
    args = [binary, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            "--prometheus-port", str(free_port()), "--log-level", "warning",
            "--worker-urls", *(f"http://127.0.0.1:{p}" for p in ports)]  # fmt: skip
    proc = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"vllm-router did not start: {log.read_text()[-2000:]}")


def traffic(router: str, requests: int, templates: int, tick: int) -> None:
    with httpx.Client(base_url=router, timeout=30) as client:
        for n in range(requests):
            head = f"Template {n % templates}. You follow the support rules. " + " ".join(
                f"rule{n % templates}-{k}" for k in range(60)
            )
            messages = [{"role": "system", "content": head},
                        {"role": "user", "content": f"Tick {tick}, question {n}?"}]  # fmt: skip
            body = {"model": "sim-llm", "messages": messages, "max_tokens": 1}
            client.post("/v1/chat/completions", json=body).raise_for_status()


def measure(size: int, args: argparse.Namespace, store_url: str) -> dict[str, Any]:
    store = redis.Redis.from_url(store_url)
    store.flushdb()
    folder = Path(tempfile.mkdtemp(prefix=f"fleet{size}-"))
    replicas, ports = start_replicas(size, folder)
    router, url = start_router(ports, args.policy, folder / "router.log")
    try:
        fleet = FleetSettings(
            name="fleet", router_url=url, policy=args.policy, model="sim-llm",
            replica_kind="simulator", replicas_from="router",
            log=str(folder / "replica-{port}.log"), cache_tokens=65536, cache_block_tokens=16,
        )  # fmt: skip
        configured = Settings(
            redis_url=store_url, store_url=store_url, data_dir=folder / "data", fleets=(fleet,),
            schedule=ScheduleSettings(window_s=WINDOW_S),
        )  # fmt: skip
        per_replica = []
        start = time.time() // WINDOW_S * WINDOW_S
        for tick in range(args.ticks):
            traffic(url, args.requests_per_replica * size, args.templates, tick)
            cpu = time.process_time()
            settings, _ = look_at_fleets(configured, store)
            loop = WarmLoop(settings, store, in_process(store, settings))
            for engine in settings.engines:
                loop.tick(engine.name, now=start + tick * WINDOW_S)
            per_replica.append((time.process_time() - cpu) / len(settings.engines))
        later = per_replica[1:] or per_replica
        return {
            "replicas": size, "ticks": args.ticks,
            "cpu_s_per_tick_per_replica": round(statistics.median(later), 4),
            "cpu_s_per_tick_per_replica_all": [round(x, 4) for x in per_replica],
            "redis_keys": int(store.dbsize()),
            "redis_key_bytes": key_bytes(store),
        }  # fmt: skip
    finally:
        router.terminate()
        router.wait(timeout=20)
        assert replicas.stdin is not None
        replicas.stdin.close()
        replicas.wait(timeout=60)
        store.flushdb()


def key_bytes(store: redis.Redis) -> int:
    """Bytes the store database's keys take (``MEMORY USAGE`` summed: the server's other
    databases are not counted)."""
    return sum(int(store.memory_usage(key) or 0) for key in store.scan_iter(count=1000))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--ticks", type=int, default=3)
    parser.add_argument("--policy", default="round_robin")
    parser.add_argument("--templates", type=int, default=8)
    parser.add_argument("--requests-per-replica", type=int, default=4)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--db", type=int, default=12)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--serve-simulators", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_simulators:
        serve_simulators(args.serve_simulators, args.folder)
        return
    if args.smoke:
        args.sizes, args.ticks = [2], 2
    rows = [measure(size, args, f"{args.redis}/{args.db}") for size in args.sizes]
    print("| replicas | CPU s per tick per replica | Redis keys | Redis key bytes (MB) |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['replicas']} | {row['cpu_s_per_tick_per_replica']} | "
              f"{row['redis_keys']} | {row['redis_key_bytes'] / 1e6:.2f} |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
