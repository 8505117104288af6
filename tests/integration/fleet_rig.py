"""A fleet for tests: simulator replicas behind the real ``vllm-router``, its settings (replicas
taken from the router's worker list, each replica's log its source), users who send templates
through the router as chats, the replica watch that warms through the loop in this process, and
the measure of the issue: templates whose first request through the router is served from
cache, and which replica it landed on."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from jobs.cmd_watch import Watcher
from jobs.embedded import free_port
from jobs.simulator import SimulatorConfig, SimulatorServer
from pipeline.planner.plan import WarmPlan
from tasks.adapters import redis_keys
from tasks.adapters.engine_client import samples_from_text
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.targets.base import WarmOptions
from tasks.services.batch_runner import BatchRunner
from tasks.services.replica_watch import warm_for_trigger
from tasks.settings import ScheduleSettings, Settings
from tasks.settings.fleets import FleetSettings
from tests.integration.router import RouterProcess

#: prefix-cache blocks of one simulator replica (16 tokens each)
CAPACITY_BLOCKS = 1024


def template(n: int, words: int = 120) -> str:
    """A template's system prompt: ``words`` words (about as many simulator tokens)."""
    return f"Template {n}. You are assistant number {n} of the support desk. " + " ".join(
        f"rule{n}-{k}" for k in range(words)
    )


@dataclass
class Warmups:
    """What the warm-ups sent: requests and prompt tokens per replica (where they landed)."""

    requests: Counter[str] = field(default_factory=Counter)
    tokens: Counter[str] = field(default_factory=Counter)
    verified: list[tuple[str, str]] = field(default_factory=list)  # (item key, replica)
    batches: list[dict[str, Any]] = field(default_factory=list)


class FleetRig:
    """``count`` replicas behind a router with ``policy``; see the module docstring."""

    def __init__(
        self, tmp_path: Path, policy: str, count: int, store: Any, store_url: str,
        words: int = 120,
    ) -> None:  # fmt: skip
        self.tmp, self.policy, self.store, self.words = tmp_path, policy, store, words
        self.kv = policy == "kv_aware"  # replicas publish KV events, which the router reads
        self.replicas = [self._replica() for _ in range(count)]
        self.metrics_port = free_port()
        kv_args = ["--kv-event-block-size", "16", "--kv-event-model", "sim-llm"] if self.kv else []
        for r in self.replicas if self.kv else []:  # (each flag names one worker)
            kv_args += [
                "--kv-event-source",
                f"{r.url}={r.config.kv_events_endpoint}",
                "--kv-event-replay-source",
                f"{r.url}={r.config.kv_replay_endpoint}",
            ]
        self.router = RouterProcess(
            [r.url for r in self.replicas], policy, tmp_path / "router.log",
            "--prometheus-port", str(self.metrics_port), *kv_args,
        )  # fmt: skip
        fleet = FleetSettings(
            name="fleet", router_url=self.router.url, policy=policy,  # type: ignore[arg-type]
            model="sim-llm", replica_kind="simulator", replicas_from="router",
            log=str(tmp_path / "replica-{port}.log"), cache_tokens=CAPACITY_BLOCKS * 16,
            cache_block_tokens=16,
            router_metrics_url=f"http://127.0.0.1:{self.metrics_port}/metrics",
        )  # fmt: skip
        self.settings = Settings(
            redis_url=store_url, store_url=store_url, data_dir=tmp_path / "data",
            fleets=(fleet,), schedule=ScheduleSettings(window_s=60),
        )  # fmt: skip
        self.warmups = Warmups()
        self.watcher = Watcher(self.settings, store, warm=self._warm)

    def _replica(self) -> SimulatorServer:
        port = free_port()
        kv = (
            {
                "kv_events_endpoint": f"tcp://127.0.0.1:{free_port()}",
                "kv_replay_endpoint": f"tcp://127.0.0.1:{free_port()}",
            }
            if self.kv
            else {}
        )
        config = SimulatorConfig(
            log_file=self.tmp / f"replica-{port}.log", capacity_blocks=CAPACITY_BLOCKS, **kv
        )  # type: ignore[arg-type]
        return SimulatorServer(config, port=port).start()

    def start(self) -> FleetRig:
        self.router.start()
        self.watcher.poll()  # every replica new: ready (nothing served yet)
        return self

    def stop(self) -> None:
        self.router.stop()
        for replica in self.replicas:
            replica.stop()

    # --- users --------------------------------------------------------------------------------

    def send(self, n: int, question: str) -> tuple[int, int]:
        """One user's chat on template ``n`` through the router: (cached, prompt) tokens."""
        messages = [{"role": "system", "content": template(n, self.words)},
                    {"role": "user", "content": question}]  # fmt: skip
        body = {"model": "sim-llm", "messages": messages, "max_tokens": 2}
        usage = httpx.post(f"{self.router.url}/v1/chat/completions", json=body, timeout=30)
        usage.raise_for_status()
        data = usage.json()["usage"]
        return int(data["prompt_tokens_details"]["cached_tokens"]), int(data["prompt_tokens"])

    def traffic(self, templates: int, uses: int) -> None:
        for round_ in range(uses):
            for n in range(templates):
                self.send(n, f"Question {round_} about case {n}?")

    def first_uses(self, templates: int, tag: str) -> dict[int, tuple[bool, str]]:
        """One new request per template: (served from cache, the replica it landed on)."""
        out = {}
        for n in range(templates):
            before = self.lookups()
            # (the tag first: first uses of two scenarios share no words after the template)
            cached, prompt = self.send(n, f"{tag}: a first question on case {n}?")
            after = self.lookups()
            landed = [k for k in after if after[k] > before.get(k, 0.0)]
            out[n] = (cached >= prompt // 2, landed[0] if len(landed) == 1 else "?")
        return out

    def lookups(self) -> dict[str, float]:
        names = {f"fleet-127.0.0.1-{r.port}": r.url for r in self.replicas}
        out = {}
        for name, url in names.items():
            try:
                text = httpx.get(f"{url}/metrics", timeout=5).text
            except httpx.TransportError:
                continue
            samples = samples_from_text(text, frozenset({"vllm:prefix_cache_queries_total"}))
            out[name] = sum(v for _, _, v in samples)
        return out

    # --- prewarm ------------------------------------------------------------------------------

    def observe(self) -> None:
        """Let the loop read every replica's log (as its window tick would)."""
        from tasks.services.loop import WarmLoop

        settings, _ = self._current()
        loop = WarmLoop(settings, self.store, self._submit(settings))
        for engine in settings.engines:
            loop.observe(engine)

    def _current(self) -> tuple[Settings, list[dict[str, Any]]]:
        from tasks.services.fleets import look_at_fleets

        return look_at_fleets(self.settings, self.store)

    def poll(self) -> list[dict[str, Any]]:
        """One look of the replica watch; what fired was warmed here."""
        return self.watcher.poll()

    def _warm(self, engine: str, kind: str) -> dict[str, Any]:
        settings = self.watcher.settings
        return warm_for_trigger(settings, self.store, engine, kind, self._submit(settings))

    def _submit(self, settings: Settings):
        def submit(plan: WarmPlan, engine: str) -> str:
            plans = PlanStore(self.store)
            options = WarmOptions(plan.budget.batch_size, ordered=True, road=plan.road)
            batches = plans.save(plan, engine, options)
            runner = BatchRunner(self.store, settings)
            for batch in range(batches):
                self._count(runner.run(plan.plan_id, batch), plan, batch, engine)
            plans.mark_finished(plan.plan_id)
            return plan.plan_id

        return submit

    def _count(self, result: dict[str, Any], plan: WarmPlan, batch: int, engine: str) -> None:
        self.warmups.batches.append({**result, "engine": engine, "notes": plan.notes})
        if result["replicas"]:  # through the router: where each landed
            for replica, row in result["replicas"].items():
                self.warmups.requests[replica] += row["items"]
                self.warmups.tokens[replica] += row["tokens"]
        else:
            self.warmups.requests[engine] += result["engine_requests"]
            items = plan.batches(plan.budget.batch_size)[batch]
            self.warmups.tokens[engine] += sum(
                i.tokens for i in items if i.kind in ("prefix", "shape")
            )

    # --- scenarios ----------------------------------------------------------------------------

    def after_cooldowns(self) -> None:
        """As if the trigger cooldowns had run out (a replica restarted twice in 30 s is warmed
        once): the scenarios follow each other in seconds."""
        for key in self.store.scan_iter(match=redis_keys.TRIGGER_COOLDOWN.split("{")[0] + "*"):
            self.store.delete(key)

    def rolling_restart(self) -> None:
        for replica in self.replicas:
            replica.restart()
            self.poll()

    def restart_all(self) -> None:
        self.router.stop()
        for replica in self.replicas:
            replica.restart()
        self.router.start()
        self.poll()

    def add_replica(self) -> None:
        replica = self._replica()
        self.replicas.append(replica)
        added = httpx.post(f"{self.router.url}/add_worker", params={"url": replica.url}, timeout=60)
        added.raise_for_status()
        self.poll()

    def held_tokens(self) -> dict[str, int]:
        """Blocks each replica's cache holds now, in tokens."""
        out = {}
        for r in self.replicas:
            assert r.engine is not None
            out[f"fleet-127.0.0.1-{r.port}"] = int(r.engine.cache.usage * CAPACITY_BLOCKS * 16)
        return out
