"""Topic drift as a trigger: the warm-up loop on a workload whose users change topic.

The loop's services (``WarmLoop`` ticks, the one planner, plans run through the real batch
runner and WAL on a real Redis) warm the engine simulator once per window; the fleet's traffic
(:mod:`benchmarks.topic_workload`: code questions, then legal ones from window ``--change``)
is sent to the simulator after each tick and logged as a prewarm JSONL trace, the engine's
source, with the window's times (so windows pass in seconds, not minutes). The simulator's
cache holds about half the assistants' system prompts, and a warm-up fills it, so what a window
finds cached is what the plan made at its start chose.

Measured per run: the window whose tick fired ``topic_drift`` (None: never), and the *first
uses* of the new topic's prefixes (each assistant's first request in a window) served from
cache (``usage.prompt_tokens_details.cached_tokens`` covering the system prompt), from the
change on. Each seed runs with the trigger on (``[topics] enabled``) and off, the same traffic.

Usage::

    HF_HUB_OFFLINE=1 python benchmarks/topic_drift.py [--seeds 0 1 2 3 4] [--windows 12]
        [--change 8] [--requests 64] [--redis redis://127.0.0.1:6379] [--db 12]

Uses Redis database ``db + 1`` as the store, flushing it before each run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import redis

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.stack import in_process_submitter as in_process  # noqa: E402
from benchmarks.topic_workload import TOPICS, TopicWorkload, head_text  # noqa: E402
from jobs.simulator import SimulatorConfig, SimulatorServer  # noqa: E402
from models.forecaster import SAVED_NAME  # noqa: E402
from models.persistence import list_versions  # noqa: E402
from pipeline.prefix_blocks import count_tokens  # noqa: E402
from tasks.adapters.observations import models_root  # noqa: E402
from tasks.adapters.plan_store import PlanStore  # noqa: E402
from tasks.services.loop import WarmLoop  # noqa: E402
from tasks.settings import (  # noqa: E402
    EngineSettings,
    LoopSettings,
    ScheduleSettings,
    Settings,
    SourceSettings,
    TopicSettings,
)

WINDOW_S = 60
#: The first window of the run (Unix seconds), a whole hour.
START = 1_800_000_000.0 // 3600 * 3600
BLOCK = 16
#: A first use is served from cache when this many of its tokens were cached: the heads differ
#: from their fourth word on, so only a head's own blocks can give that many.
SERVED_TOKENS = 64


@dataclass
class Run:
    """What one run saw."""

    fired: list[int] = field(default_factory=list)  # windows whose tick fired topic_drift
    new_first_uses: int = 0
    new_served: int = 0
    old_first_uses: int = 0
    old_served: int = 0
    drift_notes: int = 0  # plans made with the newest windows weighted
    forecaster_versions: int = 0  # versions of the engine's forecaster saved in the run

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def capacity_blocks(workload: TopicWorkload) -> int:
    """Cache blocks for about half of the system prompts of both topics."""
    heads = [head_text(t, str(team)) for t in TOPICS for team in TOPICS[t]["teams"]]
    mean = sum(count_tokens(h) for h in heads) / len(heads)
    return int(len(heads) / 2 * mean / BLOCK * 1.25)


def settings_for(url: str, trace: Path, data: Path, store_url: str, topics: bool, blocks: int,
                 min_windows: int) -> Settings:  # fmt: skip
    engine = EngineSettings(name="sim", url=url, model="sim-llm", kind="simulator",
                            cache_tokens=blocks * BLOCK, cache_block_tokens=BLOCK)  # fmt: skip
    return Settings(
        redis_url=store_url, store_url=store_url, data_dir=data, engines=(engine,),
        sources=(SourceSettings(engine="sim", kind="jsonl", path=str(trace)),),
        schedule=ScheduleSettings(window_s=WINDOW_S),
        loop=LoopSettings(min_windows_for_model=min_windows),
        topics=TopicSettings(enabled=topics),
    )  # fmt: skip


def serve_window(
    client: httpx.Client, workload: TopicWorkload, w: int, trace: Path, run: Run
) -> None:
    """Send window ``w``'s requests, count its first uses, log them to the trace."""
    seen: set[str] = set()
    lines = []
    for i, (topic, head, question) in enumerate(workload.window(w)):
        body = {"model": "sim-llm", "prompt": head + question, "max_tokens": 1}
        usage = client.post("/v1/completions", json=body).raise_for_status().json()["usage"]
        cached = int(usage["prompt_tokens_details"]["cached_tokens"])
        ts = START + w * WINDOW_S + i * WINDOW_S / (workload.requests + 1)
        record = {"ts": ts, "request_id": f"w{w}-{i}", "model": "sim-llm",
                  "prompt": head + question, "prompt_tokens": usage["prompt_tokens"]}  # fmt: skip
        lines.append(json.dumps(record))
        if head in seen or workload.change is None or w < workload.change:
            continue
        seen.add(head)
        new = topic == workload.new
        if new:
            run.new_first_uses += 1
            run.new_served += cached >= SERVED_TOKENS
        else:
            run.old_first_uses += 1
            run.old_served += cached >= SERVED_TOKENS
    with trace.open("a") as handle:
        handle.write("\n".join(lines) + "\n")


def weighted(store: redis.Redis, plan_id: str | None) -> bool:
    """Whether the plan weighted the newest windows (its notes say ``drift: …``)."""
    if plan_id is None:
        return False
    return any(note.startswith("drift:") for note in PlanStore(store).load(plan_id)[0].notes)


def run_once(workload: TopicWorkload, topics: bool, store_url: str, min_windows: int = 1000) -> Run:
    """One run of ``workload`` with the topic trigger on or off."""
    store = redis.Redis.from_url(store_url)
    store.flushdb()
    run = Run()
    blocks = capacity_blocks(workload)
    with tempfile.TemporaryDirectory(prefix="prewarm-topic-drift-") as tmp:
        folder = Path(tmp)
        trace = folder / "trace.jsonl"
        trace.touch()
        config = SimulatorConfig(capacity_blocks=blocks, block_size=BLOCK,
                                 log_file=folder / "engine.log")  # fmt: skip
        with SimulatorServer(config) as sim, httpx.Client(base_url=sim.url, timeout=60) as client:
            settings = settings_for(sim.url, trace, folder / "data", store_url, topics, blocks,
                                    min_windows)  # fmt: skip
            now = [START]
            loop = WarmLoop(settings, store, in_process(store, settings), clock=lambda: now[0])
            for w in range(workload.windows):
                now[0] = START + w * WINDOW_S
                outcome = loop.tick("sim", now=now[0]) or {}
                if any(t["kind"] == "topic_drift" for t in outcome.get("triggers", [])):
                    run.fired.append(w)
                last = (
                    PlanStore(store).load(outcome["plan_id"])[0] if outcome.get("plan_id") else None
                )
                run.drift_notes += bool(last and any(n.startswith("drift:") for n in last.notes))
                serve_window(client, workload, w, trace, run)
            run.forecaster_versions = len(list_versions(models_root(folder / "data", "sim")
                                                        / SAVED_NAME))  # fmt: skip
    store.flushdb()
    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--change", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--db", type=int, default=12)
    parser.add_argument(
        "--min-windows-for-model", type=int, default=1000,
        help="the loop's setting (default: plans on the frequency estimate)",
    )  # fmt: skip
    parser.add_argument("--steady", action="store_true", help="also a run whose topic holds")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    store_url = f"{args.redis}/{args.db + 1}"
    results: dict[str, Any] = {"per_seed": {}}
    totals = {"on": [0, 0], "off": [0, 0]}
    for seed in args.seeds:
        workload = TopicWorkload(windows=args.windows, requests=args.requests, change=args.change,
                                 seed=seed)  # fmt: skip
        row = {}
        for arm, on in (("on", True), ("off", False)):
            run = run_once(workload, on, store_url, args.min_windows_for_model)
            row[arm] = run.to_dict()
            totals[arm][0] += run.new_served
            totals[arm][1] += run.new_first_uses
        if args.steady:
            row["steady_on"] = run_once(replace(workload, change=None), True, store_url,
                                        args.min_windows_for_model).to_dict()  # fmt: skip
        results["per_seed"][seed] = row
        print(f"seed {seed}: {json.dumps(row)}", flush=True)
    results["new_topic_first_uses_served"] = {arm: {"served": s, "first_uses": n}
                                              for arm, (s, n) in totals.items()}  # fmt: skip
    print(f"new topic's first uses served from cache, summed over seeds {args.seeds}: "
          f"trigger on {totals['on'][0]} of {totals['on'][1]}, "
          f"trigger off {totals['off'][0]} of {totals['off'][1]}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
