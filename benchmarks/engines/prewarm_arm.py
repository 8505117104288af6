"""The prewarm arm: the real ``prewarm`` CLI and a real Celery worker warm a restarted engine.

Only the engine's own log of the history reaches prewarm (``prewarm ingest``); the engine URL and
cache size come from a TOML settings file, as an operator would configure them; ``prewarm plan``
chooses what to warm and in what order; ``prewarm warm`` runs the plan on the worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.engines.client import Served
from benchmarks.engines.references import WarmContext

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_NAME = "vllm-cpu"


def settings_toml(url: str, model: str, cache_tokens: int | None) -> str:
    """prewarm settings for one vLLM engine; ``cache_tokens`` is its prefix-cache capacity."""
    lines = [
        "[[engines]]",
        f'name = "{ENGINE_NAME}"',
        f'url = "{url}"',
        f'model = "{model}"',
        'kind = "vllm"',
        "max_concurrency = 1",
    ]
    if cache_tokens is not None:
        lines.append(f"cache_tokens = {cache_tokens}")
    lines += ["", "[budget]", "max_items = 100", "max_seconds = 300.0", "batch_size = 4", ""]
    return "\n".join(lines)


@dataclass
class PrewarmRun:
    """Paths and environment for one setting's prewarm runs (worker and CLI share them)."""

    work_dir: Path
    env: dict[str, str]
    commands: list[str] = field(default_factory=list)

    def cli(self, *args: str, timeout: float = 900.0) -> subprocess.CompletedProcess[str]:
        """Run ``prewarm ARGS`` (the installed console script's module) and keep its output."""
        cmd = [sys.executable, "-c", "from jobs.cli import main; main()", *args]
        self.commands.append("prewarm " + " ".join(args))
        done = subprocess.run(
            cmd, cwd=REPO_ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        log = self.work_dir / "cli.log"
        with log.open("a") as handle:
            handle.write(
                f"$ prewarm {' '.join(args)}\n{done.stdout}{done.stderr}rc={done.returncode}\n"
            )
        if done.returncode != 0:
            raise RuntimeError(
                f"prewarm {args[0]} failed ({done.returncode}): {done.stderr[-2000:]}"
            )
        return done


def warm_with_prewarm(run: PrewarmRun, history_log: Path, ctx: WarmContext) -> list[Served]:
    """ingest → plan → warm through the CLI; return nothing per request (the worker sent them)."""
    records = run.work_dir / "records"
    plan = run.work_dir / "plan.json"
    run.cli("ingest", str(history_log), "--out", str(records))
    run.cli("plan", "--engine", ENGINE_NAME, "--records", str(records), "--out", str(plan))
    started = time.monotonic()
    done = run.cli("warm", str(plan), "--engine", ENGINE_NAME)
    summary = {"warm_s": round(time.monotonic() - started, 2), "stdout": done.stdout[-2000:]}
    (run.work_dir / "warm-summary.json").write_text(json.dumps(summary, indent=1))
    return []


def plan_items(plan_path: Path) -> list[dict]:
    """The items of a written plan (to report what was chosen and in what order)."""
    if not plan_path.exists():
        return []
    return list(json.loads(plan_path.read_text()).get("items", []))
