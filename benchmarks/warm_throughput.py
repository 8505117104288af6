"""Warm-up throughput of one worker process against the simulator at zero latency, and against
the same prompts sent straight to the engine.

Three settings, each run ``--repeats`` times (median reported), all from the same process:

* **batched**: prewarm warms a plan of ``--items`` items in batches of ``--batch-size`` (each
  batch one WAL transaction: recorded, primed, verified by a probe, committed);
* **per item**: the same with one item per batch (``--per-item`` items);
* **direct**: the baseline — the same prompts posted straight to the engine's
  ``/v1/completions`` with httpx from this process, grouped as prewarm groups them
  (``WarmOptions.prompts_per_request`` to a request), one request after another, with no queue,
  no WAL and no verification: what a hand-rolled ``max_tokens=1`` replay loop does.

Items are text prefixes (about 64 pseudo-tokens each, every one new to the engine). One
``celery worker --pool solo`` process does prewarm's work; the simulator is served by its own
process (``prewarm simulator --no-stdout-log``), so it shares no interpreter lock with this
process. Time is taken from ``submit_plan`` to the plan's last batch result (``wait_plan``,
polling every 50 ms). Two rates per setting: items per wall-clock second (bounded by whatever is
slowest — on a small machine, the simulator's own Python per prompt) and items per CPU-second of
the process doing the sending (the worker; for ``direct``, this process). Goals: >= 1,000
items/s per worker process with batching; batched prewarm within 15% of the direct replay's wall
rate (prewarm's price for being safe: the WAL, the probes, the queue).

Usage::

    python benchmarks/warm_throughput.py [--items 4000] [--per-item 400] [--batch-size 64]
        [--repeats 3] [--redis redis://127.0.0.1:6379] [--db 10] [--smoke]

``--smoke`` runs tiny sizes once (seconds), as the test suite does. Uses Redis databases ``db``
(broker) and ``db + 1`` (store), flushing both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.engines.engine import wait_until_answers  # noqa: E402
from benchmarks.stack import timed_plan  # noqa: E402
from jobs.embedded import WorkerProcess, free_port  # noqa: E402
from pipeline.planner.plan import PlanBudget, WarmItem, WarmPlan, new_plan_id  # noqa: E402
from tasks import settings as settings_module  # noqa: E402
from tasks.adapters.targets.base import WarmOptions  # noqa: E402
from tasks.settings import Settings  # noqa: E402

QUEUE = "warm-bench"
MODEL = "sim-llm"


def items(n: int, tag: str) -> list[WarmItem]:
    """``n`` distinct text prefixes of about 64 pseudo-tokens."""
    head = "You answer questions about invoices and refunds politely and briefly, citing policy"
    return [
        WarmItem("prefix", f"{tag}-{i}", MODEL, text=f"{head} {tag} number {i}: " * 4, tokens=64)
        for i in range(n)
    ]


@contextlib.contextmanager
def simulator_process() -> Iterator[str]:
    """``prewarm simulator`` at zero latency in its own process; yields its URL."""
    port = free_port()
    cmd = [sys.executable, "-c", "from jobs.cli import main; main()", "simulator", "--port",
           str(port), "--prefill-ms-per-token", "0", "--decode-ms-per-token", "0",
           "--overhead-ms", "0", "--capacity-blocks", "1000000", "--max-num-seqs", "256",
           "--no-stdout-log"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        why = wait_until_answers(f"{url}/health", proc, time.monotonic() + 60, every_s=0.2)
        if why is not None:
            raise SystemExit(f"simulator {why}")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def run_prewarm(
    n: int, batch_size: int, settings: Settings, worker: psutil.Process
) -> tuple[float, float]:
    """(items per wall second, items per worker CPU second) for one plan of ``n`` items."""
    plan = WarmPlan(new_plan_id(), "sim", tuple(items(n, new_plan_id()[:6])),
                    PlanBudget(batch_size=batch_size))  # fmt: skip
    return timed_plan(plan, settings, QUEUE, worker)


def run_direct(n: int, client: httpx.Client) -> tuple[float, float]:
    """(items per wall second, items per CPU second of this process) for the same ``n``
    prompts posted straight to the engine, grouped as prewarm groups them."""
    texts = [item.text or "" for item in items(n, new_plan_id()[:6])]
    group = WarmOptions().prompts_per_request
    me = psutil.Process()
    cpu_before = sum(me.cpu_times()[:2])
    started = time.perf_counter()
    for start in range(0, n, group):
        body = {"model": MODEL, "prompt": texts[start : start + group], "max_tokens": 1,
                "temperature": 0.0}  # fmt: skip
        client.post("/v1/completions", json=body).raise_for_status()
    elapsed = time.perf_counter() - started
    cpu = sum(me.cpu_times()[:2]) - cpu_before
    return n / elapsed, n / max(cpu, 1e-6)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--per-item", type=int, default=400, help="items in one-item batches")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--db", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, once (seconds)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.items, args.per_item, args.batch_size, args.repeats = 96, 8, 32, 1

    broker, store_url = f"{args.redis}/{args.db}", f"{args.redis}/{args.db + 1}"
    for url in (broker, store_url):
        redis.Redis.from_url(url).flushdb()
    with simulator_process() as sim_url, tempfile.TemporaryDirectory() as tmp:
        toml = Path(tmp) / "prewarm.toml"
        toml.write_text(f'[[engines]]\nname = "sim"\nurl = "{sim_url}"\nmodel = "{MODEL}"\n'
                        'kind = "simulator"\nmax_concurrency = 8\n')  # fmt: skip
        env = {"PREWARM_CONFIG": str(toml), "PREWARM_REDIS_URL": broker,
               "PREWARM_STORE_URL": store_url}  # fmt: skip
        os.environ.update(env)
        settings_module.current_settings.cache_clear()
        settings = settings_module.current_settings()
        worker_env = {**os.environ, "PYTHONPATH": str(REPO)}
        worker = WorkerProcess(
            toml, Path(tmp) / "worker.log", 1, env=worker_env, queues=QUEUE, pool="solo"
        )
        try:
            worker.wait_ready(180)
            with httpx.Client(base_url=sim_url, timeout=60) as client:
                results = measure(args, settings, psutil.Process(worker.proc.pid), client)
        finally:
            worker.stop()
    report(args, results)


def measure(
    args: argparse.Namespace, settings: Settings, worker: psutil.Process, client: httpx.Client
) -> dict[str, list[float]]:
    run_prewarm(min(args.items, 200), args.batch_size, settings, worker)  # imports, connections
    run_direct(min(args.items, 200), client)
    runs = {
        "batched": lambda: run_prewarm(args.items, args.batch_size, settings, worker),
        "per item": lambda: run_prewarm(args.per_item, 1, settings, worker),
        "direct": lambda: run_direct(args.items, client),
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(args.repeats):  # interleaved, so drift on a shared machine hits all alike
        for name, run in runs.items():
            samples[name].append(run())
    return {
        name: [statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)]
        for name, values in samples.items()
    }


def report(args: argparse.Namespace, results: dict[str, list[float]]) -> None:
    print(f"{'setting':10s} {'wall items/s':>13s} {'sender-CPU items/s':>19s}")
    for name, (wall, cpu) in results.items():
        print(f"{name:10s} {wall:13.0f} {cpu:19.0f}")
    batched, direct = results["batched"][0], results["direct"][0]
    print(f"wall: batched prewarm at {batched / direct:.0%} of the direct replay "
          f"(overhead {1 - batched / direct:.1%}); batching speed-up "
          f"{batched / results['per item'][0]:.1f}x")  # fmt: skip
    summary = {
        "args": vars(args),
        "items_per_s_wall_cpu": results,
        "batched_over_direct_wall": round(batched / direct, 3),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
