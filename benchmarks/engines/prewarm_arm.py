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

from benchmarks.engines.engine import CPU_BLOCK_TOKENS
from benchmarks.engines.references import WarmContext

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_NAME = "vllm-cpu"


def settings_toml(url: str, model: str, cache_tokens: int | None) -> str:
    """prewarm settings for one vLLM engine; ``cache_tokens`` is its KV cache as vLLM reports
    it (blocks × block size, null block included); the CPU build's blocks hold 128 tokens."""
    lines = [
        "[[engines]]",
        f'name = "{ENGINE_NAME}"',
        f'url = "{url}"',
        f'model = "{model}"',
        'kind = "vllm"',
        "max_concurrency = 1",
    ]
    # The block size is known whatever the capacity: an item shorter than a block is never planned.
    lines.append(f"cache_block_tokens = {CPU_BLOCK_TOKENS}")
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

    def cli(
        self, *args: str, timeout: float = 900.0, ok: tuple[int, ...] = (0,)
    ) -> subprocess.CompletedProcess[str]:
        """Run ``prewarm ARGS`` (the installed console script's module) and keep its output;
        an exit status outside ``ok`` fails the run."""
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
        if done.returncode not in ok:
            raise RuntimeError(
                f"prewarm {args[0]} failed ({done.returncode}): {done.stderr[-2000:]}"
            )
        return done


def warm_with_prewarm(run: PrewarmRun, history_log: Path, ctx: WarmContext) -> int:
    """``prewarm ingest`` → ``prewarm plan`` → ``prewarm warm --ordered`` through the CLI.

    ``--ordered`` runs the batches one after another: the engine's cache is an LRU, so the plan's
    priming order (most valuable last) must reach the engine in that order. Returns the number of
    plan items (the worker sent their requests); step timings go to ``warm-summary.json``.
    """
    records, plan = run.work_dir / "records", run.work_dir / "plan.json"
    steps: dict[str, float] = {}
    printed = ""
    for step, args in (
        ("ingest", ("ingest", str(history_log), "--out", str(records))),
        ("plan", ("plan", "--from", str(records), "--engine", ENGINE_NAME, "--out", str(plan))),
        ("warm", ("warm", "--plan", str(plan), "--engine", ENGINE_NAME, "--ordered")),
    ):
        started = time.monotonic()
        # `prewarm warm` exits 1 when an item failed: the run goes on and the summary says so
        printed = run.cli(*args, ok=(0, 1) if step == "warm" else (0,)).stdout
        steps[step] = round(time.monotonic() - started, 2)
    items = plan_items(plan)
    summary = {
        "seconds": steps,
        "items": len(items),
        "plan_tokens": sum(i["tokens"] for i in items),
        "notes": json.loads(plan.read_text()).get("notes", []) if plan.exists() else [],
        "warm_report": _printed_report(printed),
    }
    (run.work_dir / "warm-summary.json").write_text(json.dumps(summary, indent=1))
    return len(items)


def _printed_report(stdout: str) -> dict:
    """The JSON report ``prewarm warm`` prints last (empty when it printed none)."""
    start = stdout.rfind("\n{")
    try:
        return dict(json.loads(stdout[start + 1 :])) if start >= 0 else {}
    except ValueError:
        return {}


def plan_items(plan_path: Path) -> list[dict]:
    """The items of a written plan (to report what was chosen and in what order)."""
    if not plan_path.exists():
        return []
    return list(json.loads(plan_path.read_text()).get("items", []))
