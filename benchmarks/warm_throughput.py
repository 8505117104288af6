"""Warm-up throughput of one worker process against the simulator at zero latency.

Four settings, each run ``--repeats`` times (median reported), all in the same process:

* batched (``--batch-size`` items per task/transaction), with the WAL and without it;
* one task per item (batch size 1), with the WAL and without it.

Items are text prefixes (about 64 pseudo-tokens each, every one new to the engine), primed and
verified by a probe, as ``prewarm warm`` does. One ``celery worker --pool solo`` process does all
the work; the simulator is served by its own process (``prewarm simulator --no-stdout-log``: an
engine is its own server, and vLLM logs no requests unless asked), so it shares no interpreter
lock with this process's polling (every 50 ms); time is taken from ``submit_plan`` to the plan's
last batch result. Two rates per setting: items per wall-clock second (bounded by whatever is
slowest — on a small machine, the simulator's own Python per prompt) and items per CPU-second of
the worker process (what one worker process can do when the engine keeps up). Goals: >= 1,000
items/s per worker process with batching; WAL overhead <= 15%.

Usage::

    python benchmarks/warm_throughput.py [--items 4000] [--per-item 400] [--batch-size 64]
        [--repeats 3] [--redis redis://127.0.0.1:6379] [--db 10]

Uses Redis databases ``db`` (broker) and ``db + 1`` (store), flushing both.
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
from pathlib import Path

import psutil
import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.engines.engine import wait_until_answers  # noqa: E402
from jobs.embedded import free_port  # noqa: E402
from pipeline.planner.plan import PlanBudget, WarmItem, WarmPlan, new_plan_id  # noqa: E402
from tasks import settings as settings_module  # noqa: E402
from tasks.adapters.targets.base import WarmOptions  # noqa: E402

QUEUE = "warm-bench"


def items(n: int, tag: str) -> list[WarmItem]:
    """``n`` distinct text prefixes of about 64 pseudo-tokens."""
    head = "You answer questions about invoices and refunds politely and briefly, citing policy"
    return [
        WarmItem(
            "prefix", f"{tag}-{i}", "sim-llm", text=f"{head} {tag} number {i}: " * 4, tokens=64
        )
        for i in range(n)
    ]


def start_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "celery", "-A", "tasks.celery_app:app", "worker", "--pool",
           "solo", "-Q", QUEUE, "--without-gossip", "--without-mingle", "--without-heartbeat",
           "-n", f"bench-{os.getpid()}@%h", "--loglevel", "WARNING"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return proc


@contextlib.contextmanager
def simulator_process():
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


def run_once(
    n: int, batch_size: int, use_wal: bool, settings, worker: psutil.Process
) -> tuple[float, float]:
    """(items per wall second, items per worker CPU second) for one plan of ``n`` items."""
    from tasks.warm_tasks import plan_report, submit_plan

    plan = WarmPlan(new_plan_id(), "sim", tuple(items(n, new_plan_id()[:6])),
                    PlanBudget(batch_size=batch_size))  # fmt: skip
    options = WarmOptions(batch_size=batch_size, use_wal=use_wal)
    cpu_before = sum(worker.cpu_times()[:2])
    started = time.perf_counter()
    plan_id = submit_plan(plan, settings=settings, options=options, queue=QUEUE)
    while True:
        report = plan_report(plan_id, settings=settings)
        if report["done"]:
            break
        time.sleep(0.05)
    elapsed = time.perf_counter() - started
    cpu = sum(worker.cpu_times()[:2]) - cpu_before
    if report["items_ok"] != n:
        raise SystemExit(f"plan {plan_id}: {report}")
    return n / elapsed, n / max(cpu, 1e-6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--per-item", type=int, default=400, help="items in one-task-per-item runs")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--db", type=int, default=10)
    args = parser.parse_args()

    broker, store_url = f"{args.redis}/{args.db}", f"{args.redis}/{args.db + 1}"
    for url in (broker, store_url):
        redis.Redis.from_url(url).flushdb()
    with simulator_process() as sim_url, tempfile.TemporaryDirectory() as tmp:
        toml = Path(tmp) / "prewarm.toml"
        toml.write_text(f'[[engines]]\nname = "sim"\nurl = "{sim_url}"\nmodel = "sim-llm"\n'
                        'kind = "simulator"\nmax_concurrency = 8\n')  # fmt: skip
        env = {**os.environ, "PREWARM_CONFIG": str(toml), "PREWARM_REDIS_URL": broker,
               "PREWARM_STORE_URL": store_url, "PYTHONPATH": str(REPO)}  # fmt: skip
        os.environ.update(
            {k: env[k] for k in ("PREWARM_CONFIG", "PREWARM_REDIS_URL", "PREWARM_STORE_URL")}
        )
        settings_module.current_settings.cache_clear()
        settings = settings_module.current_settings()
        worker = start_worker(env, Path(tmp) / "worker.log")
        try:
            results = measure(args, settings, psutil.Process(worker.pid))
        finally:
            worker.terminate()
            worker.wait(30)
    report(args, results)


def measure(args: argparse.Namespace, settings, worker: psutil.Process) -> dict[str, list[float]]:
    run_once(200, args.batch_size, True, settings, worker)  # warm-up: imports, connections
    settings_list = {
        "batched, WAL": (args.items, args.batch_size, True),
        "batched, no WAL": (args.items, args.batch_size, False),
        "per item, WAL": (args.per_item, 1, True),
        "per item, no WAL": (args.per_item, 1, False),
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in settings_list}
    for _ in range(args.repeats):  # interleaved, so drift on a shared machine hits all alike
        for name, (n, size, wal) in settings_list.items():
            samples[name].append(run_once(n, size, wal, settings, worker))
    return {
        name: [statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)]
        for name, values in samples.items()
    }


def report(args: argparse.Namespace, results: dict[str, list[float]]) -> None:
    print(f"{'setting':18s} {'wall items/s':>13s} {'worker-CPU items/s':>19s}")
    for name, (wall, cpu) in results.items():
        print(f"{name:18s} {wall:13.0f} {cpu:19.0f}")
    for k, label in ((0, "wall"), (1, "worker CPU")):
        batched = 1 - results["batched, WAL"][k] / results["batched, no WAL"][k]
        per_item = 1 - results["per item, WAL"][k] / results["per item, no WAL"][k]
        speedup = results["batched, WAL"][k] / results["per item, WAL"][k]
        print(f"{label}: WAL overhead batched {batched:.1%}, per item {per_item:.1%}; "
              f"batching speed-up (WAL) {speedup:.1f}x")  # fmt: skip
    print(json.dumps({"args": vars(args), "items_per_s_wall_cpu": results}))


if __name__ == "__main__":
    main()
