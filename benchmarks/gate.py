"""Time to ready through the gate: 1, 4 and 16 simulator replicas joining a gated fleet at once.

A fleet of ``--base`` simulator replicas behind the real ``vllm-router`` (``--policy``) serves
``--templates`` chat templates through the router; their logs are observed (the fleet's hot
set). Then ``size`` new replicas start at once (in a process of their own, as the base fleet's
are, so this process's time is prewarm's); each is looked at by a gate of its own, every
``--every`` seconds in a thread (as each pod's ``prewarm gate`` sidecar does), which removes it
from the router's list, plans the hot set, runs it on the replica in its process, verifies it
held, and adds it. Reported per size: p50 and p99 over the joining replicas of

- **time to ready**: from the replica answering to its admission;
- **prewarm's part**: detection (from the replica answering to the gate's first look that saw
  it, and that look), planning, dispatch and verification;
- **warm**: the run of the plan on the engine (the simulator's prefill and the requests'
  round trips);

with each stage's p50. A rehearsal join of one replica runs first and is not counted: a sidecar
imports the planner when it starts, long before its engine has loaded a model.

Usage::

    python benchmarks/gate.py [--sizes 1 4 16] [--base 2] [--policy power_of_two]
        [--redis redis://127.0.0.1:6379] [--db 13] [--json FILE] [--smoke]

``--smoke`` joins one and two replicas to a base of two. Flushes Redis database ``db``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import redis

from benchmarks.fleet_scale import serve_simulators, start_router, traffic
from pipeline.gate import PREWARM_STAGES, GateRecord
from tasks.services.gate import Gatekeeper, Timings, run_here
from tasks.services.loop import WarmLoop
from tasks.settings import ScheduleSettings, Settings
from tasks.settings.fleets import FleetSettings, ReplicaSettings

STAGES = ("detection", "planning", "dispatch", "warm", "verification")


def start_replicas(count: int, folder: Path) -> tuple[subprocess.Popen[str], list[int], float]:
    """``count`` simulator replicas in a process of their own; their ports and when they all
    answered (this process's clock)."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-simulators", str(count), "--folder", str(folder)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    ports = json.loads(proc.stdout.readline())
    return proc, ports, time.time()


def stop(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=60)


def settings_for(
    router: str, folder: Path, urls: list[str], store_url: str, policy: str
) -> Settings:
    fleet = FleetSettings(
        name="fleet", router_url=router, policy=policy, model="sim-llm",  # type: ignore[arg-type]
        replica_kind="simulator", replicas=tuple(ReplicaSettings(url=u) for u in urls),
        log=str(folder / "replica-{port}.log"), cache_tokens=65536, cache_block_tokens=16,
        gate=True, gate_deadline_s=120,
    )  # fmt: skip
    return Settings(redis_url=store_url, store_url=store_url, data_dir=folder / "data",
                    fleets=(fleet,), schedule=ScheduleSettings(window_s=60))  # fmt: skip


def sidecar(settings: Settings, store: redis.Redis, engine: str, every_s: float,
            out: dict[str, GateRecord]) -> None:  # fmt: skip
    """One replica's gate, looking every ``every_s`` until it is admitted."""
    timings = Timings()
    gate = Gatekeeper(settings, store, run_here(settings, store, timings), timings=timings)
    gate.prepare()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        (record,) = gate.look(only=engine) or (None,)
        if record is not None and record.admits:
            out[engine] = record
            return
        time.sleep(every_s)


def join(size: int, base: list[str], ctx: dict[str, Any]) -> list[dict[str, float]]:
    """``size`` replicas join at once; each one's stages (seconds)."""
    proc, ports, up_at = start_replicas(size, ctx["folder"])
    try:
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        settings = settings_for(ctx["router"], ctx["folder"], base + urls, ctx["store_url"],
                                ctx["policy"])  # fmt: skip
        names = {e.url: e.name for e in settings.engines}
        admitted: dict[str, GateRecord] = {}
        threads = [threading.Thread(target=sidecar, args=(settings, ctx["store"], names[u],
                                                          ctx["every"], admitted))
                   for u in urls]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [row(admitted[names[u]], up_at) for u in urls]
    finally:
        stop(proc)


def row(record: GateRecord, up_at: float) -> dict[str, float]:
    """A replica's stages; detection counts from when it answered."""
    assert record.admitted is not None and record.state.value == "ready", record
    stages = {s: record.stages.get(s, 0.0) for s in STAGES}
    stages["detection"] += max(0.0, record.detected - up_at)
    stages["prewarm"] = sum(stages[s] for s in PREWARM_STAGES)
    stages["time_to_ready"] = record.admitted - up_at
    return stages


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


def measure(sizes: list[int], args: argparse.Namespace, store_url: str) -> list[dict[str, Any]]:
    store = redis.Redis.from_url(store_url)
    store.flushdb()
    folder = Path(tempfile.mkdtemp(prefix="gate-"))
    replicas, ports, _ = start_replicas(args.base, folder)
    router, url = start_router(ports, args.policy, folder / "router.log")
    base = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        traffic(url, args.templates * args.uses, args.templates, 0)
        settings = settings_for(url, folder, base, store_url, args.policy)
        loop = WarmLoop(settings, store, run_here(settings, store))
        for engine in settings.engines:
            loop.observe(engine)
        ctx = {"folder": folder, "router": url, "store": store, "store_url": store_url,
               "policy": args.policy, "every": args.every}  # fmt: skip
        join(1, base, ctx)  # the rehearsal: imports and first-use costs, not counted
        rows = []
        for size in sizes:
            per = join(size, base, ctx)
            summary: dict[str, Any] = {"replicas": size}
            for key in ("time_to_ready", "prewarm", "warm"):
                values = [r[key] for r in per]
                summary[f"{key}_p50_s"], summary[f"{key}_p99_s"] = (
                    pct(values, 0.5),
                    pct(values, 0.99),
                )
            summary["stages_p50_s"] = {s: round(statistics.median(r[s] for r in per), 4)
                                       for s in STAGES}  # fmt: skip
            rows.append(summary)
        return rows
    finally:
        router.terminate()
        router.wait(timeout=20)
        stop(replicas)
        store.flushdb()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--base", type=int, default=2)
    parser.add_argument("--policy", default="power_of_two")
    parser.add_argument("--templates", type=int, default=8)
    parser.add_argument("--uses", type=int, default=3)
    parser.add_argument("--every", type=float, default=0.02, help="seconds between looks")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--db", type=int, default=13)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--serve-simulators", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_simulators:
        serve_simulators(args.serve_simulators, args.folder)
        return
    if args.smoke:
        args.sizes = [1, 2]
    rows = measure(args.sizes, args, f"{args.redis}/{args.db}")
    print(
        "| joining | time to ready p50 / p99 (ms) | prewarm's part p50 / p99 (ms) | "
        "warm on the engine p50 (ms) | detection / planning / dispatch / verification p50 (ms) |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        st = r["stages_p50_s"]
        print(f"| {r['replicas']} | {r['time_to_ready_p50_s'] * 1e3:.0f} / "
              f"{r['time_to_ready_p99_s'] * 1e3:.0f} | {r['prewarm_p50_s'] * 1e3:.0f} / "
              f"{r['prewarm_p99_s'] * 1e3:.0f} | {r['warm_p50_s'] * 1e3:.0f} | "
              f"{st['detection'] * 1e3:.0f} / {st['planning'] * 1e3:.0f} / "
              f"{st['dispatch'] * 1e3:.0f} / {st['verification'] * 1e3:.0f} |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
