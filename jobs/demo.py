"""``prewarm demo``: the whole loop on one machine, with nothing to install but Python packages.

It starts an embedded Redis, the engine SIMULATOR and a real Celery worker; replays a generated
workload cold (recording the time to first token of each template's first request); restarts
the simulator as a deploy would (cold cache); runs prewarm's warm-up loop on the worker
(``prewarm.loop.warm``, reason ``demo``: read the simulator's vLLM-format log — a configured
``[[sources]]`` entry — observe, plan with the one planner, warm through the WAL); replays
again. Every latency is SIMULATED by the simulator's latency model, and the printout says so.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from jobs.demo_report import print_result, result_json
from jobs.demo_result import DemoResult, Served
from jobs.demo_workload import DemoRequest, generate_workload
from jobs.embedded import EmbeddedRedis, WorkerProcess
from jobs.simulator import LatencyModel, SimulatorConfig, SimulatorServer
from pipeline.errors import TransientError
from tasks.adapters.chat_stream import ChatClient, chat_client, timed_chat
from tasks.settings import Settings, current_settings, load_settings

if TYPE_CHECKING:
    from jobs.demo_telemetry import DemoRecorder

ENGINE = "demo-simulator"
MODEL = "sim-llm"


@dataclass
class DemoConfig:
    """Size of the workload and the simulator's latency model."""

    templates: int = 4
    questions: int = 6
    sentences: int = 60
    prefill_ms_per_token: float = 0.6
    decode_ms_per_token: float = 3.0
    overhead_ms: float = 10.0
    block_size: int = 16
    capacity_blocks: int = 8192
    max_tokens: int = 8


def _ttft(client: ChatClient, request: DemoRequest, max_tokens: int) -> Served:
    body = {
        "model": MODEL, "messages": request.messages(), "max_tokens": max_tokens, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip
    ttft, usage = timed_chat(client, body)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    return Served(request.template, ttft, int(usage.get("prompt_tokens", 0)), cached)


def replay(
    url: str, workload: list[DemoRequest], max_tokens: int, advance: Callable[[], None]
) -> list[Served]:
    """Send every request in order, streaming, and time each one's first token."""
    with chat_client(url) as client:
        served = []
        for request in workload:
            served.append(_ttft(client, request, max_tokens))
            advance()
        return served


def _write_settings(path: Path, redis: EmbeddedRedis, sim_url: str, config: DemoConfig) -> Settings:
    path.write_text(
        f'redis_url = "{redis.url(0)}"\nstore_url = "{redis.url(1)}"\n'
        f'data_dir = "{path.parent / "data"}"\n\n'
        f'[[engines]]\nname = "{ENGINE}"\nurl = "{sim_url}"\nmodel = "{MODEL}"\n'
        f'kind = "simulator"\nmax_concurrency = 4\n'
        f"prefill_s_per_token = {config.prefill_ms_per_token / 1000}\n"
        f"cache_tokens = {config.capacity_blocks * config.block_size}\n"
        f"cache_block_tokens = {config.block_size}\n\n"
        f'[[sources]]\nengine = "{ENGINE}"\nkind = "vllm-log"\n'
        f'path = "{path.parent / "engine.log"}"\n\n'
        f"[budget]\nmax_items = 20\nbatch_size = 2\n\n[schedule]\nwindow_s = 60\n"
    )
    return load_settings({}, path)


def _use_settings(config_file: Path, settings: Settings) -> None:
    """Point this process's settings and Celery app at the demo's own Redis.

    The demo is its own process, so it may set its environment: the environment wins over the
    settings file, and a user's PREWARM_REDIS_URL must not send the demo's tasks elsewhere.
    """
    from tasks.celery_app import app, celery_config

    for key in [k for k in os.environ if k.startswith("PREWARM_")]:
        del os.environ[key]
    os.environ["PREWARM_CONFIG"] = str(config_file)
    current_settings.cache_clear()
    app.conf.update(celery_config(settings))


class DemoRun:
    """One run of the demo in ``workdir``; ``run()`` returns what it measured."""

    def __init__(
        self, config: DemoConfig, workdir: Path, progress: Progress, report: Path | None = None
    ) -> None:
        self.config = config
        self.workdir = workdir
        self.progress = progress
        self.report_path = report
        self.workload = generate_workload(config.templates, config.questions, config.sentences)
        self.result = DemoResult()

    @contextmanager
    def step(self, text: str, total: int | None = None) -> Iterator[Callable[[], None]]:
        """A progress line for one step; yields a function that advances it by one."""
        task = self.progress.add_task(text, total=total)
        yield lambda: self.progress.advance(task)
        self.progress.update(task, total=total or 1, completed=total or 1)

    def _simulator(self) -> SimulatorServer:
        c = self.config
        latency = LatencyModel(c.prefill_ms_per_token, c.decode_ms_per_token, c.overhead_ms)
        sim_config = SimulatorConfig(
            model=MODEL, block_size=c.block_size, capacity_blocks=c.capacity_blocks,
            latency=latency, log_file=self.workdir / "engine.log", stats_interval_s=5.0,
        )  # fmt: skip
        return SimulatorServer(sim_config)

    def run(self) -> DemoResult:
        started = time.perf_counter()
        self.started = time.time()
        redis = EmbeddedRedis(self.workdir / "redis")
        sim = self._simulator()
        worker: WorkerProcess | None = None
        try:
            with self.step("Starting embedded Redis and the engine SIMULATOR"):
                redis.start()
                sim.start()
            config_file = self.workdir / "prewarm.toml"
            settings = _write_settings(config_file, redis, sim.url, self.config)
            _use_settings(config_file, settings)
            worker = WorkerProcess(config_file, self.workdir / "worker.log")  # boots meanwhile
            self._measure(sim, worker, settings)
        finally:
            with self.step("Stopping the worker, the simulator and Redis"):
                if worker is not None:
                    worker.stop()
                sim.stop()
                redis.stop()
        self.result.seconds = time.perf_counter() - started
        return self.result

    def _measure(self, sim: SimulatorServer, worker: WorkerProcess, settings: Settings) -> None:
        from jobs.demo_telemetry import DemoRecorder  # pandas: only when the demo runs

        n, c = len(self.workload), self.config
        rec = DemoRecorder(settings, ENGINE, self.workdir / "engine.log", c.block_size)
        rec.sample()
        cold_start = rec.boundary()
        with self.step(f"Replaying {n} requests against a cold cache", n) as advance:
            self.result.cold = replay(sim.url, self.workload, c.max_tokens, rec.every(4, advance))
        rec.close_window(cold_start, rec.boundary())
        with self.step("Restarting the simulator, as after a deploy (cache now cold)"):
            sim.restart()
            rec.sample()
        with self.step("Waiting for the Celery worker"):
            worker.wait_ready()
        self._warm(settings)
        rec.sample()
        warm_start = rec.boundary()
        with self.step(f"Replaying {n} requests after warming", n) as advance:
            self.result.warm = replay(sim.url, self.workload, c.max_tokens, rec.every(4, advance))
        learned = self.result.learned
        rec.close_window(warm_start, rec.boundary(), learned.plan if learned else None)
        self._write_report(rec)

    def _write_report(self, rec: DemoRecorder) -> None:
        if self.report_path is None:
            return
        from jobs.report import write_report

        with self.step(f"Writing the report to {self.report_path}"):
            write_report(rec.store, ENGINE, self.started - 1, time.time() + 1, self.report_path)

    def _warm(self, settings: Settings) -> None:
        from jobs.demo_pipeline import learned_from  # pandas: only when the demo runs
        from tasks.adapters.store import store_client
        from tasks.celery_app import app
        from tasks.warm_tasks import plan_report

        with self.step("The warm-up loop on the worker: read the simulator's log → observe → plan"):
            outcome = app.send_task("prewarm.loop.warm", (ENGINE, "demo")).get(timeout=120)
            if not outcome.get("plan_id"):
                raise TransientError(f"the loop planned nothing: {outcome['status']}")
            self.result.learned = learned_from(settings, store_client(settings), outcome)
        plan = self.result.learned.plan
        with self.step(
            f"Warming {len(plan.items)} prefixes through the worker", len(plan.items)
        ) as advance:
            deadline, done_items = time.monotonic() + 60, 0
            while time.monotonic() < deadline:
                report = plan_report(plan.plan_id, settings=settings)
                finished = report["items_ok"] + report["items_failed"]
                for _ in range(finished - done_items):
                    advance()
                done_items = finished
                if report["done"]:
                    break
                time.sleep(0.1)
            self.result.report = report


def run_demo(
    config: DemoConfig | None = None,
    workdir: Path | None = None,
    console: Console | None = None,
    report: Path | None = None,
) -> DemoResult:
    """Run the demo in ``workdir`` (default: a temporary directory, removed after a successful
    run and kept, for its logs, after a failed one) and return what it measured."""
    console = console or Console()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    directory = workdir or Path(tempfile.mkdtemp(prefix="prewarm-demo-"))
    with Progress(*columns, console=console) as progress:
        result = DemoRun(config or DemoConfig(), directory, progress, report).run()
    if workdir is None:
        shutil.rmtree(directory, ignore_errors=True)
    return result


def demo(
    templates: Annotated[int, typer.Option(min=1, max=4, help="Prompt templates.")] = 4,
    questions: Annotated[int, typer.Option(min=2, max=6, help="Questions per template.")] = 6,
    prefill_ms_per_token: Annotated[
        float, typer.Option(min=0, help="Simulated prefill cost.")
    ] = 0.6,
    workdir: Annotated[
        Path | None, typer.Option(help="Keep logs here (default: a temp dir).")
    ] = None,
    report_json: Annotated[
        Path | None, typer.Option(help="Also write the measurements to this JSON file.")
    ] = None,
    report: Annotated[
        Path | None, typer.Option(help="Also write the HTML report (prewarm report) here.")
    ] = None,
) -> None:
    """Run the whole loop on this machine against the engine SIMULATOR (latencies simulated)."""

    console = Console()
    console.print(
        "[bold]prewarm demo[/bold] — embedded Redis, a real Celery worker and the engine "
        "[bold]SIMULATOR[/bold]; all latencies below are SIMULATED."
    )
    config = DemoConfig(
        templates=templates, questions=questions, prefill_ms_per_token=prefill_ms_per_token
    )
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    result = run_demo(config, workdir, console, report)
    print_result(result, generate_workload(templates, questions, config.sentences), console)
    if report_json is not None:
        report_json.write_text(json.dumps(result_json(result), indent=2, default=str))


def register(app: typer.Typer) -> None:
    """Add ``prewarm demo`` to the CLI."""
    app.command("demo")(demo)
