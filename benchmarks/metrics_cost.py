"""What prewarm's metrics cost: one scrape with a week of history, and the warm-up throughput.

**Scrape** — the store is filled with a week of one cluster's telemetry, written through the
real ``tasks.adapters.telemetry`` functions with the clock stepped: per engine, an engine read every
``--watch-s`` (10 s, the replica watch's default period), and every 5-minute window a plan of
``--plan-items`` items, its batches, a loop tick and the window's outcome. Then the api's
``/metrics`` (``jobs.api.build_api``, in-process ASGI) is scraped ``--scrapes`` times; the median
is compared with scrapes of the same api on an empty store, in the same process. The report of
the week (``prewarm report``'s renderer) is timed too.

**Throughput** — ``benchmarks/warm_throughput.py``'s setting (one ``--pool solo`` worker, the
simulator at zero latency in its own process, items primed and probed), with two workers on two
queues: one as shipped, one started by this file with the telemetry calls replaced by no-ops
(this switch exists only here). Plans alternate between them, ``--repeats`` times; medians of
items per wall second and per worker-CPU second, batched and one task per item. Two worker
processes differ by more than the telemetry (cache, scheduling): run to run, this part swings by
±10% on the shared 2-core machine.

**Runner** — the same warm-up in one process, so the two arms differ by the telemetry alone: the
real batch runner (``tasks.services.batch_runner.BatchRunner``: WAL, prime, verify, commit) runs
plans of ``--items`` items against the same simulator, with the telemetry calls on and switched off
(:func:`telemetry_off`) back to back, ``--repeats`` times in ABBA order; the overhead is the
median over repeats of each pair's ratio of the runner's CPU seconds (``time.process_time``: this
process only, the simulator runs in its own) and of wall seconds, batched and one item per batch.
It also times the telemetry calls themselves in the arm with them (:class:`TelemetryClock`, the
writer thread's writes included): ``telemetry_share_of_wall``, their seconds over the arm's wall
seconds, the overhead measured directly, without the pairing's run-to-run noise.

Usage::

    python benchmarks/metrics_cost.py [--part scrape|throughput|runner|both] [--engines 2]
        [--items 4000] [--per-item 400] [--batch-size 64] [--repeats 3]
        [--redis redis://127.0.0.1:6379] [--db 10] [--days 7] [--smoke]

``--smoke`` runs the scrape and the runner parts at tiny sizes (six hours of one engine's
telemetry, three scrapes, plans of a few dozen items, once): seconds, as the test suite does.
Uses Redis databases ``db`` (broker) and ``db + 1`` (store), flushing both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.stack import timed_plan  # noqa: E402
from benchmarks.warm_throughput import items, simulator_process  # noqa: E402
from pipeline.planner.plan import PlanBudget, WarmItem, WarmPlan, new_plan_id  # noqa: E402
from pipeline.triggers import EngineSample  # noqa: E402
from tasks import settings as settings_module  # noqa: E402
from tasks.adapters import telemetry  # noqa: E402
from tasks.adapters.targets.base import WarmOptions  # noqa: E402

DAY_S = 86400
WINDOW_S = 300
NO_TELEMETRY = "--worker-without-telemetry"


# -- scrape --------------------------------------------------------------------------------
def fill_week(store: redis.Redis, engine: str, args: argparse.Namespace, end: float) -> int:
    """``args.days`` (a week) of ``engine``'s telemetry ending at ``end``; returns the events
    written."""
    rng = random.Random(engine)
    pool = [f"{engine}-prefix-{n}" for n in range(args.pool)]
    hits = queries = 0.0
    events = 0
    span_s = args.days * DAY_S
    start = end - span_s
    for step in range(int(span_s / args.watch_s)):
        now = start + step * args.watch_s
        queries += 5000
        hits += 5000 * rng.uniform(0.5, 0.95)
        sample = EngineSample(engine, now, prefix_queries=queries, prefix_hits=hits,
                              ttft_buckets=((0.1, float(step)), (float("inf"), 2.0 * step)),
                              start_time=start)  # fmt: skip
        telemetry.record_engine_sample(store, engine, sample, now=now)
        events += 1
        if step % int(WINDOW_S / args.watch_s) == 0:
            events += window(store, engine, rng, pool, now, args.plan_items)
    return events


def window(
    store: redis.Redis, engine: str, rng: random.Random, pool: list[str], now: float, size: int
) -> int:
    """One window's plan, batch, tick and outcome (four events)."""
    chosen = rng.sample(pool, size)
    plan_items = tuple(WarmItem("prefix", k, "m", text="x", tokens=512) for k in chosen)
    plan = WarmPlan(new_plan_id(), engine, plan_items, PlanBudget(max_items=size), dropped=3)
    telemetry.record_plan(store, plan, engine, reason="window", now=now)
    summary = {"state": "committed", "items": size, "ok": size, "failed": 0, "seconds": 0.5,
               "txn": "t", "failures": []}  # fmt: skip
    telemetry.record_batch(store, engine, plan.plan_id, plan_items, summary, now=now)
    telemetry.record_tick(store, engine, ok=True, interval_s=WINDOW_S, now=now)
    observed = {k: rng.randint(1, 20) for k in rng.sample(pool, size)}
    telemetry.record_window(store, engine, (now - WINDOW_S, now), observed, pool,
                            {k: 5.0 for k in chosen})  # fmt: skip
    return 4


def scrape_ms(client: Any, n: int) -> float:
    """Median milliseconds of ``n`` scrapes of ``/metrics``."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        response = client.get("/metrics")
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200
    return statistics.median(times)


def measure_scrape(args: argparse.Namespace, broker: str, store_url: str) -> dict[str, Any]:
    from starlette.testclient import TestClient

    from jobs.api import build_api
    from jobs.report import load, render
    from tasks.settings import Settings

    store = redis.Redis.from_url(store_url)
    settings = Settings(redis_url=broker, store_url=store_url)
    with TestClient(build_api(settings)) as client:
        empty = scrape_ms(client, args.scrapes)
        end = time.time()
        started = time.perf_counter()
        events = sum(fill_week(store, f"engine-{n}", args, end) for n in range(args.engines))
        fill_s = time.perf_counter() - started
        week = scrape_ms(client, args.scrapes)
        size = len(client.get("/metrics").text.splitlines())
    out = {
        "engines": args.engines, "events": events, "fill_s": round(fill_s, 1),
        "store_bytes": int(store.info("memory")["used_memory"]),
        "scrape_ms_empty": round(empty, 2), "scrape_ms_week": round(week, 2),
        "ratio": round(week / empty, 2), "scrape_lines": size,
    }  # fmt: skip
    print(json.dumps(out), flush=True)
    started = time.perf_counter()
    html = render(load(store, "engine-0", end - args.days * DAY_S, end))
    return {**out, "report_s_week": round(time.perf_counter() - started, 2),
            "report_bytes": len(html)}  # fmt: skip


# -- throughput ----------------------------------------------------------------------------
@contextlib.contextmanager
def telemetry_off() -> Iterator[None]:
    """The warm-up path's telemetry calls as no-ops for the duration (the control arm)."""
    import tasks.adapters.wal_store
    import tasks.services.batch_runner
    import tasks.warm_tasks

    with replaced({
        (tasks.services.batch_runner, "plan_labels"): lambda store, plan_id, engine: (
            engine, "cli"
        ),
        (tasks.services.batch_runner, "defer_batch"): lambda *args, **kwargs: None,
        (tasks.services.batch_runner, "record_wal"): lambda *args, **kwargs: None,
        (tasks.adapters.wal_store, "record_wal"): lambda *args, **kwargs: None,
        (tasks.warm_tasks, "record_plan"): lambda *args, **kwargs: None,
    }):  # fmt: skip
        yield


@contextlib.contextmanager
def replaced(replacements: dict[tuple[Any, str], Any]) -> Iterator[None]:
    """``(object, attribute) -> value`` set for the duration, the originals put back after."""
    originals = {target: getattr(*target) for target in replacements}
    for (owner, name), value in replacements.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for (owner, name), original in originals.items():
            setattr(owner, name, original)


def worker_without_telemetry(celery_args: list[str]) -> None:
    """A Celery worker whose telemetry calls do nothing (the benchmark's control arm)."""
    from celery.__main__ import main as celery_main

    with telemetry_off():
        sys.argv = ["celery", *celery_args]
        celery_main()


def start_worker(env: dict[str, str], log: Path, queue: str, telemetry_on: bool) -> Any:
    args = ["-A", "tasks.celery_app:app", "worker", "--pool", "solo", "-Q", queue,
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-n", f"{queue}-{os.getpid()}@%h", "--loglevel", "WARNING"]  # fmt: skip
    head = ["-m", "celery"] if telemetry_on else [str(Path(__file__)), NO_TELEMETRY]
    out = log.open("wb")
    return subprocess.Popen([sys.executable, *head, *args], cwd=REPO, env=env, stdout=out,
                            stderr=subprocess.STDOUT)  # fmt: skip


def telemetry_arm(on: bool) -> contextlib.AbstractContextManager[None]:
    """The arm's telemetry: as shipped (``on``) or switched off (:func:`telemetry_off`)."""
    return contextlib.nullcontext() if on else telemetry_off()


def run_once(
    n: int, batch_size: int, queue: str, on: bool, settings: Any, worker: Any
) -> tuple[float, float]:
    """(items per wall second, items per worker CPU second) for one plan of ``n`` items."""
    plan = WarmPlan(new_plan_id(), "sim", tuple(items(n, new_plan_id()[:6])),
                    PlanBudget(batch_size=batch_size))  # fmt: skip
    with telemetry_arm(on):  # the submitting side's record_plan
        return timed_plan(plan, settings, queue, worker)


def measure_throughput(args: argparse.Namespace, broker: str, store_url: str) -> dict[str, Any]:
    with simulator_process() as sim_url, tempfile.TemporaryDirectory() as tmp:
        toml = Path(tmp) / "prewarm.toml"
        toml.write_text(f'[[engines]]\nname = "sim"\nurl = "{sim_url}"\nmodel = "sim-llm"\n'
                        'kind = "simulator"\nmax_concurrency = 8\n')  # fmt: skip
        env = {**os.environ, "PREWARM_CONFIG": str(toml), "PREWARM_REDIS_URL": broker,
               "PREWARM_STORE_URL": store_url, "PYTHONPATH": str(REPO)}  # fmt: skip
        os.environ.update({k: env[k] for k in ("PREWARM_CONFIG", "PREWARM_REDIS_URL",
                                               "PREWARM_STORE_URL")})  # fmt: skip
        settings_module.current_settings.cache_clear()
        settings = settings_module.current_settings()
        arms = {"metrics": True, "no metrics": False}
        procs = {name: start_worker(env, Path(tmp) / f"{on}.log", f"bench-{on}", on)
                 for name, on in arms.items()}  # fmt: skip
        try:
            workers = {name: psutil.Process(p.pid) for name, p in procs.items()}
            return _alternate(args, settings, arms, workers)
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(30)


def _alternate(args: argparse.Namespace, settings: Any, arms: dict[str, bool],
               workers: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    shapes = {"batched": (args.items, args.batch_size), "per item": (args.per_item, 1)}
    for name, on in arms.items():  # warm-up: imports, connections
        run_once(200, args.batch_size, f"bench-{on}", on, settings, workers[name])
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.repeats):  # interleaved, so drift on a shared machine hits both alike
        for shape, (n, size) in shapes.items():
            for name, on in arms.items():
                run = run_once(n, size, f"bench-{on}", on, settings, workers[name])
                samples.setdefault((shape, name), []).append(run)
    medians = {f"{shape}, {name}": [statistics.median(v[0] for v in runs),
                                    statistics.median(v[1] for v in runs)]
               for (shape, name), runs in samples.items()}  # fmt: skip
    overhead = {f"{shape} {label}": round(1 - medians[f"{shape}, metrics"][k]
                                          / medians[f"{shape}, no metrics"][k], 4)
                for shape in shapes for k, label in ((0, "wall"), (1, "worker CPU"))}  # fmt: skip
    return {"items_per_s_wall_cpu": medians, "overhead": overhead}


# -- runner (one process) ------------------------------------------------------------------
class TelemetryClock:
    """Wall seconds spent inside the warm-up path's telemetry calls (the writer thread's
    writes included), while :meth:`timing` is on: the overhead measured directly, free of the
    run-to-run noise of comparing two runs."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.lock = threading.Lock()

    def wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                with self.lock:
                    self.seconds += time.perf_counter() - started

        return timed

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        import tasks.services.batch_runner

        runner = tasks.services.batch_runner
        targets = [(runner, "defer_batch"), (runner, "plan_labels"),
                   (telemetry, "record_plan"), (telemetry.PENDING_BATCHES, "flush")]  # fmt: skip
        with replaced({target: self.wrap(getattr(*target)) for target in targets}):
            yield


def run_plan_here(store: redis.Redis, settings: Any, n: int, batch_size: int,
                  on: bool) -> tuple[float, float, float]:  # fmt: skip
    """(CPU s, wall s, s inside telemetry calls) per item of one plan of ``n`` items run here by
    the real batch runner."""
    from tasks.adapters.plan_store import PlanStore
    from tasks.services.batch_runner import BatchRunner

    plan = WarmPlan(new_plan_id(), "sim", tuple(items(n, new_plan_id()[:6])),
                    PlanBudget(batch_size=batch_size))  # fmt: skip
    clock = TelemetryClock()
    with telemetry_arm(on), clock.timing() if on else contextlib.nullcontext():
        plans = PlanStore(store)
        batches = plans.save(plan, "sim", WarmOptions(batch_size, ordered=True))
        runner = BatchRunner(store, settings)
        cpu, wall = time.process_time(), time.perf_counter()
        if on:
            telemetry.record_plan(store, plan, "sim")
        for batch in range(batches):
            runner.run(plan.plan_id, batch)
        if on:  # what the writer thread has not written yet is this plan's cost too
            telemetry.flush_batch_metrics()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if plans.report(plan.plan_id)["items_ok"] != n:
        raise SystemExit(f"plan {plan.plan_id}: {plans.report(plan.plan_id)}")
    return cpu / n, wall / n, clock.seconds / n


def measure_runner(args: argparse.Namespace, broker: str, store_url: str) -> dict[str, Any]:
    from tasks.settings import EngineSettings, Settings

    store = redis.Redis.from_url(store_url)
    with simulator_process() as sim_url:
        engine = EngineSettings(name="sim", url=sim_url, model="sim-llm", kind="simulator",
                                max_concurrency=8)  # fmt: skip
        settings = Settings(redis_url=broker, store_url=store_url, engines=(engine,))
        shapes = {"batched": (args.items, args.batch_size), "per item": (args.per_item, 1)}
        for on in (True, False):  # warm-up: imports, connections
            run_plan_here(store, settings, min(args.items, 200), args.batch_size, on)
        samples: dict[tuple[str, bool], list[tuple[float, float, float]]] = {}
        for repeat in range(args.repeats):  # paired, in ABBA order: drift hits both arms alike
            for shape, (n, size) in shapes.items():
                for on in (True, False) if repeat % 2 == 0 else (False, True):
                    samples.setdefault((shape, on), []).append(
                        run_plan_here(store, settings, n, size, on))  # fmt: skip
    medians = {key: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
               for key, runs in samples.items()}  # fmt: skip
    # each repeat's own ratio (the arms ran back to back), then the median over repeats
    paired = {f"{shape} {label}": round(statistics.median(
                  on[k] / off[k] for on, off in zip(samples[(shape, True)], samples[(shape, False)],
                                                    strict=True)) - 1, 4)
              for shape in shapes for k, label in ((0, "runner CPU"), (1, "wall"))}  # fmt: skip
    return {
        "ms_per_item_cpu_wall": {f"{shape}, {'metrics' if on else 'no metrics'}":
                                 [round(c * 1000, 4), round(w * 1000, 4)]
                                 for (shape, on), (c, w) in medians.items()},
        "overhead": paired,
        # the telemetry calls' own seconds over the arm's wall seconds, median over repeats
        "telemetry_share_of_wall": {shape: round(statistics.median(
            t / w for _, w, t in samples[(shape, True)]), 4) for shape in shapes},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--part", choices=("scrape", "throughput", "runner", "both"),
                        default="both", help="both: scrape and throughput")  # fmt: skip
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--watch-s", type=float, default=10.0)
    parser.add_argument("--plan-items", type=int, default=50)
    parser.add_argument("--pool", type=int, default=500, help="distinct items per engine")
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--per-item", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--db", type=int, default=10)
    parser.add_argument("--days", type=float, default=7.0, help="telemetry history to scrape")
    parser.add_argument("--smoke", action="store_true", help="scrape and runner, tiny sizes")
    args = parser.parse_args(argv)
    chosen = {"both": {"scrape", "throughput"}}.get(args.part, {args.part})
    if args.smoke:
        chosen, args.part = {"scrape", "runner"}, "scrape+runner"
        args.engines, args.days, args.watch_s, args.plan_items, args.pool = 1, 0.25, 60.0, 5, 50
        args.scrapes, args.items, args.per_item, args.batch_size, args.repeats = 3, 64, 4, 32, 1
    broker, store_url = f"{args.redis}/{args.db}", f"{args.redis}/{args.db + 1}"
    results: dict[str, Any] = {"args": vars(args)}
    parts = (("scrape", measure_scrape), ("throughput", measure_throughput),
             ("runner", measure_runner))  # fmt: skip
    for part, measure in parts:
        if part in chosen:
            for url in (broker, store_url):
                redis.Redis.from_url(url).flushdb()
            results[part] = measure(args, broker, store_url)
            print(json.dumps({part: results[part]}, indent=1), flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == NO_TELEMETRY:
        worker_without_telemetry(sys.argv[2:])
    else:
        main()
