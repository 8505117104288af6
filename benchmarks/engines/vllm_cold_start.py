"""Cold start after a deploy, on a real vLLM CPU engine: prewarm against no warm-up and references.

What runs (see ``../shared/ENGINES.md`` for the engine and the locally built model):

1. A vLLM CPU server with prefix caching serves the *history*: requests drawn from 16 templates
   of 600-1500 tokens with short, always different user parts (chat and completions); see
   :mod:`benchmarks.engines.workload` for the workload and why it is honest. The server's stdout
   (``VLLM_LOGGING_LEVEL=DEBUG``: prompts, token ids, request bodies) is the history log.
2. For each arm the server is restarted (its cache is empty, as after a deploy), the arm warms it
   (or not), then the *future* traffic is replayed one request at a time, streaming.
   Arms: ``prewarm`` (``prewarm ingest`` of the history log → ``prewarm plan`` → ``prewarm warm``,
   on a real Celery worker against the test Redis), ``none`` (the control), ``replay_newest``
   (the hand-rolled replay: the newest logged prompt of each template re-sent), ``resend_logged``
   and, where the cache is smaller than the working set, ``prime_all_seen`` and ``oracle``
   (:mod:`benchmarks.engines.references`). What each warm-up cost the engine (prompt tokens,
   requests) is read from its ``/metrics`` before the future is replayed.
3. For each template's first request after the restart (the requests a cold start hurts): was it
   served from cache (``usage.prompt_tokens_details.cached_tokens > 0``) and its time to first
   token.

Settings: ``fits`` (default cache, 1024 blocks: every prefix fits; goal ≥90 % of first uses from
cache and median TTFT ≥5× lower than ``none``) and ``half`` (``--num-gpu-blocks-override 64`` =
8192 tokens, about half the working set; goal ≥85 % of the oracle's first-use hits and more than
both baselines).

Run from the repository root, in the project venv, with the test Redis::

    PREWARM_TEST_REDIS_DB=12 python -m benchmarks.engines.vllm_cold_start --setting both \\
        --seeds 0,1,2 --arms prewarm,replay_newest

Timings on a shared 2-core machine vary by about ±15 %; hits are exact. The load average is
recorded with the results.

``--smoke`` runs the pure parts only, with no vLLM and no model (what the test suite runs): a
small workload measured in words instead of tokens, every arm's summary of a made-up replay
(prewarm hits every first use, the others none), the goals and the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.engines.client import Served, replay
from benchmarks.engines.engine import (
    CPU_BLOCK_TOKENS,
    SERVED_NAME,
    VllmServer,
    missing_prerequisites,
    vllm_model,
)
from benchmarks.engines.references import REFERENCES, WarmContext
from benchmarks.engines.workload import Workload, build_workload
from jobs.embedded import free_port

#: The default 2 GiB KV cache of this model holds 1024 blocks of 128 tokens.
SETTINGS: dict[str, tuple[int | None, tuple[str, ...]]] = {
    "fits": (None, ("none", "prewarm", "replay_newest", "resend_logged")),
    "half": (64, ("none", "prewarm", "replay_newest", "prime_all_seen", "resend_logged", "oracle")),
}
#: Engine counters read from ``/metrics`` after the warm-up (the same for every arm).
COUNTERS = {
    "vllm:prompt_tokens_total": "warm_prompt_tokens",
    "vllm:request_success_total": "warm_engine_requests",
}


@dataclass
class ArmResult:
    """One arm's outcome on the future traffic."""

    arm: str
    first_uses: int
    first_use_hits: int
    first_use_ttft_median_s: float
    first_use_ttft_s: list[float]
    first_use_hit_flags: list[bool]
    all_hits: int
    all_requests: int
    warm_requests: int
    warm_s: float
    ready_s: float
    load: str
    warm_prompt_tokens: int = 0
    warm_engine_requests: int = 0


def load_average() -> str:
    """The 1/5/15-minute load average (the machine is shared)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def engine_counters(url: str) -> dict[str, int]:
    """Prompt tokens computed and requests finished so far, from the engine's ``/metrics``
    (summed over labels): what a warm-up cost the engine, whoever sent it."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    out = dict.fromkeys(COUNTERS.values(), 0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in COUNTERS:
                out[COUNTERS[sample.name]] += int(sample.value)
    return out


def token_counter():
    """Token counts with the model's own tokenizer (``tokenizers`` reads tokenizer.json)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(vllm_model() / "tokenizer.json"))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def summarize(arm: str, served: list[Served], workload: Workload, **extra) -> ArmResult:
    """First-use hits and TTFT of one arm's replay of the future."""
    firsts = [served[p] for p in workload.first_uses()]
    ttfts = [s.ttft_s for s in firsts]
    return ArmResult(
        arm=arm,
        first_uses=len(firsts),
        first_use_hits=sum(s.hit for s in firsts),
        first_use_ttft_median_s=round(statistics.median(ttfts), 4),
        first_use_ttft_s=[round(t, 4) for t in ttfts],
        first_use_hit_flags=[s.hit for s in firsts],
        all_hits=sum(s.hit for s in served),
        all_requests=len(served),
        **extra,
    )


@dataclass
class Harness:
    """One setting's run: a port, a work directory, the workload, and the warm-up arms."""

    setting: str
    out: Path
    workload: Workload
    port: int

    @property
    def gpu_blocks(self) -> int | None:
        return SETTINGS[self.setting][0]

    def server(self, name: str) -> VllmServer:
        return VllmServer(self.port, self.out / f"{name}.log", gpu_blocks=self.gpu_blocks)

    def context(self, url: str) -> WarmContext:
        # One block is vLLM's null block and never caches anything.
        capacity = None if self.gpu_blocks is None else self.gpu_blocks - 1
        return WarmContext(url, SERVED_NAME, self.workload, capacity, CPU_BLOCK_TOKENS)

    def serve_history(self) -> Path:
        """Serve the history on a fresh engine; return its log."""
        server = self.server("history")
        with server:
            replay(server.url, self.workload.history, self.workload.templates, SERVED_NAME)
        return server.log_path

    def run_arm(self, arm: str, warm) -> ArmResult:
        """Restart the engine, warm it with ``warm(ctx)``, replay the future, summarize."""
        server = self.server(arm)
        ready_s = server.start()
        try:
            started = time.monotonic()
            warm_requests = warm(self.context(server.url))
            warm_s = time.monotonic() - started
            counters = engine_counters(server.url)
            served = replay(server.url, self.workload.future, self.workload.templates, SERVED_NAME)
        finally:
            server.stop()
        return summarize(
            arm, served, self.workload, warm_requests=warm_requests, warm_s=round(warm_s, 2),
            ready_s=round(ready_s, 1), load=load_average(), **counters,
        )  # fmt: skip


def make_prewarm(harness: Harness, history_log: Path):
    """The prewarm arm's warm function, with a real Celery worker for the whole setting."""
    from benchmarks.engines.prewarm_arm import PrewarmRun, warm_with_prewarm
    from benchmarks.stack import prewarm_environment

    work = harness.out / "prewarm"
    work.mkdir(parents=True, exist_ok=True)
    config = work / "prewarm.toml"
    run = PrewarmRun(work, prewarm_environment(config))
    return run, config, lambda ctx: warm_with_prewarm(run, history_log, ctx)


def run_setting(
    setting: str, out: Path, workload: Workload, arms: Sequence[str],
    history_log: Path | None = None,
) -> dict:  # fmt: skip
    """Serve the history (unless its log is given), then every arm on a restarted engine;
    return the results."""
    harness = Harness(setting, out, workload, free_port())
    started, load_before = time.monotonic(), load_average()
    history_log = history_log or harness.serve_history()
    results = []
    for arm in arms:
        if arm == "prewarm":
            results.append(run_prewarm_arm(harness, history_log))
        else:
            results.append(harness.run_arm(arm, REFERENCES[arm]))
        print(json.dumps(asdict(results[-1])), flush=True)
    return {
        "setting": setting,
        "gpu_blocks": harness.gpu_blocks,
        "history_log": str(history_log),
        "load_before": load_before,
        "load_after": load_average(),
        "wall_s": round(time.monotonic() - started, 1),
        "arms": [asdict(r) for r in results],
    }


def run_prewarm_arm(harness: Harness, history_log: Path) -> ArmResult:
    """The prewarm arm with its worker started before and stopped after."""
    from benchmarks.engines.prewarm_arm import settings_toml
    from benchmarks.stack import running_worker

    run, config, warm = make_prewarm(harness, history_log)
    cache = None if harness.gpu_blocks is None else harness.gpu_blocks * CPU_BLOCK_TOKENS
    url = f"http://127.0.0.1:{harness.port}"
    config.write_text(settings_toml(url, SERVED_NAME, cache))
    with running_worker(run.work_dir / "worker.log", run.env):
        result = harness.run_arm("prewarm", warm)
    (run.work_dir / "commands.txt").write_text("\n".join(run.commands) + "\n")
    return result


def goals(result: dict) -> dict:
    """The issue's goals for one setting, computed from its arms."""
    arms = {a["arm"]: a for a in result["arms"]}
    pre, none = arms.get("prewarm"), arms.get("none")
    out: dict = {}
    if pre and none:
        out["hit_rate"] = round(pre["first_use_hits"] / max(1, pre["first_uses"]), 3)
        ratio = none["first_use_ttft_median_s"] / max(1e-9, pre["first_use_ttft_median_s"])
        out["ttft_ratio_none_over_prewarm"] = round(ratio, 2)
    replay = arms.get("replay_newest")
    if pre and replay:
        out["hits_vs_replay"] = pre["first_use_hits"] - replay["first_use_hits"]
        out["tokens_vs_replay"] = pre["warm_prompt_tokens"] - replay["warm_prompt_tokens"]
    if pre and "oracle" in arms:
        out["share_of_oracle"] = round(
            pre["first_use_hits"] / max(1, arms["oracle"]["first_use_hits"]), 3
        )
        out["beats_baselines"] = all(
            pre["first_use_hits"] > arms[b]["first_use_hits"]
            for b in ("prime_all_seen", "resend_logged", "replay_newest")
            if b in arms
        )
    return out


def table(report: list[dict]) -> str:
    """Every run as one Markdown table row per arm."""
    lines = ["| setting | seed | arm | first uses from cache | warm-up requests (engine) | "
             "warm-up prompt tokens | warm-up s | load (1/5/15 min) |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for result in report:
        for a in result["arms"]:
            lines.append(
                f"| {result['setting']} | {result['seed']} | {a['arm']} | "
                f"{a['first_use_hits']} / {a['first_uses']} | {a['warm_engine_requests']} | "
                f"{a['warm_prompt_tokens']:,} | {a['warm_s']} | {a['load']} |"
            )
    return "\n".join(lines)


def smoke() -> dict:
    """The pure parts on a made-up replay (see the module doc); returns the one result."""
    workload = build_workload(lambda text: len(text.split()), 4, 16, 8, 60, 120, seed=0)
    arms = []
    for arm in SETTINGS["fits"][1]:
        hit = arm == "prewarm"
        served = [Served(r.template, 0.01 if hit else 0.05, 100, 64 if hit else 0)
                  for r in workload.future]  # fmt: skip
        result = summarize(arm, served, workload, warm_requests=0, warm_s=0.0, ready_s=0.0,
                           load=load_average())  # fmt: skip
        arms.append(asdict(result))
    report = {"setting": "fits", "seed": 0, "arms": arms}
    report["goals"] = goals(report)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", choices=[*SETTINGS, "both"], default="both")
    parser.add_argument("--arms", help="comma-separated subset of the setting's arms")
    parser.add_argument("--out", type=Path, default=Path(f"/tmp/prewarm-vllm-{int(time.time())}"))
    parser.add_argument("--templates", type=int, default=16)
    parser.add_argument("--history", type=int, default=128)
    parser.add_argument("--future", type=int, default=48)
    parser.add_argument("--seeds", default="0", help="comma-separated workload seeds")
    parser.add_argument("--smoke", action="store_true", help="the pure parts, no vLLM")
    args = parser.parse_args(argv)
    if args.smoke:
        report = smoke()
        print(json.dumps({"setting": "fits", "seed": 0, "goals": report["goals"]}))
        print(table([report]))
        return
    reason = missing_prerequisites()
    if reason:
        raise SystemExit(f"cannot run: {reason}")
    settings = list(SETTINGS) if args.setting == "both" else [args.setting]
    report = []
    for seed in (int(s) for s in args.seeds.split(",")):
        workload = build_workload(
            token_counter(), args.templates, args.history, args.future, seed=seed
        )
        history_log = None  # one history per seed, served once, read by every setting
        for setting in settings:
            arms = SETTINGS[setting][1]
            if args.arms:
                arms = tuple(a for a in args.arms.split(",") if a in arms)
            out = args.out / f"seed{seed}" / setting
            result = run_setting(setting, out, workload, arms, history_log)
            history_log = Path(result["history_log"])
            result.update(seed=seed, goals=goals(result))
            report.append(result)
            print(json.dumps({"setting": setting, "seed": seed, "goals": result["goals"]}),
                  flush=True)  # fmt: skip
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "results.json").write_text(json.dumps(report, indent=1))
    print(table(report))
    print(f"results: {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
