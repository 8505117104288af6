"""A fleet for tests: simulator replicas behind the real ``vllm-router``, its settings (replicas
taken from the router's worker list, each replica's log its source), users who send templates
through the router as chats, the replica watch that warms through the loop in this process, and
the measure of the issue: templates whose first request through the router is served from
cache, and which replica it landed on."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from jobs.cmd_watch import Watcher
from jobs.embedded import free_port
from jobs.simulator import SimulatorConfig, SimulatorServer
from pipeline.planner.plan import WarmItem, WarmPlan
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.targets.base import WarmOptions
from tasks.services.batch_runner import BatchRunner
from tasks.services.holdings import check_plan_holdings
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
    batches: list[dict[str, Any]] = field(default_factory=list)
    #: prompt tokens per (plan, replica): what one plan asks a replica to hold
    plan_tokens: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: every item sent, by key
    items: dict[str, WarmItem] = field(default_factory=dict)
    #: what each plan's post-plan check found (``check_plan_holdings``'s record)
    checks: list[dict[str, Any]] = field(default_factory=list)

    def add(
        self, result: dict[str, Any], items: Sequence[WarmItem], engine: str, notes: Sequence[str]
    ) -> None:
        """One batch's result (``BatchRunner.run``'s) and its items, sent for ``engine``."""
        self.batches.append({**result, "engine": engine, "notes": list(notes)})
        self.items.update((item.key, item) for item in items)
        if result["replicas"]:  # through the router: where each landed
            for replica, row in result["replicas"].items():
                self._sent(result["plan"], replica, row["items"], row["tokens"])
        else:
            tokens = sum(i.tokens for i in items if i.kind in ("prefix", "shape"))
            self._sent(result["plan"], engine, result["engine_requests"], tokens)

    def _sent(self, plan: str, replica: str, requests: int, tokens: int) -> None:
        self.requests[replica] += requests
        self.tokens[replica] += tokens
        self.plan_tokens[(plan, replica)] += tokens


def _read_from(path: Path, offset: int) -> str:
    with path.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


class Fleet:
    """``count`` simulator replicas behind the real router with ``policy``, and their users:
    the fleet as an operator runs it, without prewarm."""

    def __init__(
        self, tmp_path: Path, policy: str, count: int, words: int = 120, name: str = "fleet",
        router: str = "vllm-router", capacity_blocks: int = CAPACITY_BLOCKS,
    ) -> None:  # fmt: skip
        self.tmp, self.policy, self.words, self.name = tmp_path, policy, words, name
        self.router_kind, self.capacity_blocks = router, capacity_blocks
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
            "--prometheus-port", str(self.metrics_port), *kv_args, kind=router,
        )  # fmt: skip
        self.warmups = Warmups()

    def fleet_settings(self) -> FleetSettings:
        """The fleet's ``[[fleets]]`` entry: replicas from the router's list, each one's log its
        source."""
        return FleetSettings(
            name=self.name, router_url=self.router.url, policy=self.policy,  # type: ignore[arg-type]
            router=self.router_kind,  # type: ignore[arg-type]
            model="sim-llm", replica_kind="simulator", replicas_from="router",
            log=str(self.tmp / "replica-{port}.log"), cache_tokens=CAPACITY_BLOCKS * 16,
            cache_block_tokens=16,
            router_metrics_url=f"http://127.0.0.1:{self.metrics_port}/metrics",
        )  # fmt: skip

    def replica_name(self, replica: SimulatorServer) -> str:
        return f"{self.name}-127.0.0.1-{replica.port}"

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
            log_file=self.tmp / f"replica-{port}.log", capacity_blocks=self.capacity_blocks, **kv
        )  # type: ignore[arg-type]
        return SimulatorServer(config, port=port).start()

    def start_router(self) -> None:
        self.router.start()

    def stop(self) -> None:
        self.router.stop()
        for replica in self.replicas:
            replica.stop()

    # --- users --------------------------------------------------------------------------------

    #: templates whose users call ``/v1/completions`` with a text prompt (the rest chat)
    completions: frozenset[int] = frozenset()

    def send(self, n: int, question: str, url: str | None = None) -> tuple[int, int]:
        """One user's request on template ``n`` through the router (or straight to the replica
        at ``url``) — a chat, or a text prompt for the templates in :attr:`completions`:
        (cached, prompt) tokens."""
        if n in self.completions:
            route = "/v1/completions"
            body: dict[str, Any] = {"model": "sim-llm", "max_tokens": 2,
                                    "prompt": f"{template(n, self.words)}\n{question}"}  # fmt: skip
        else:
            route = "/v1/chat/completions"
            messages = [{"role": "system", "content": template(n, self.words)},
                        {"role": "user", "content": question}]  # fmt: skip
            body = {"model": "sim-llm", "messages": messages, "max_tokens": 2}
        usage = httpx.post(f"{url or self.router.url}{route}", json=body, timeout=30)
        usage.raise_for_status()
        data = usage.json()["usage"]
        return int(data["prompt_tokens_details"]["cached_tokens"]), int(data["prompt_tokens"])

    def traffic(self, templates: int, uses: int) -> None:
        for round_ in range(uses):
            for n in range(templates):
                self.send(n, f"Question {round_} about case {n}?")

    def first_uses(self, templates: int, tag: str) -> dict[int, tuple[bool, str]]:
        """One new request per template: (served from cache, the replica it landed on: the one
        whose log has its question, which no other request asks)."""
        out = {}
        for n in range(templates):
            # (the tag first: first uses of two scenarios share no words after the template)
            question = f"{tag}: a first question on case {n}?"
            before = {name: path.stat().st_size for name, path in self.logs().items()}
            cached, prompt = self.send(n, question)
            landed = [name for name, path in self.logs().items()
                      if question in _read_from(path, before.get(name, 0))]  # fmt: skip
            assert len(landed) == 1, (question, landed)
            out[n] = (cached >= prompt // 2, landed[0])
        return out

    def logs(self) -> dict[str, Path]:
        """Each replica's request log, by replica name."""
        return {self.replica_name(r): Path(r.config.log_file) for r in self.replicas}

    def held_tokens(self) -> dict[str, int]:
        """Blocks each replica's cache holds now, in tokens."""
        out = {}
        for r in self.replicas:
            assert r.engine is not None
            out[self.replica_name(r)] = int(r.engine.cache.usage * self.capacity_blocks * 16)
        return out

    # --- what operators do --------------------------------------------------------------------

    def restart_everything(self) -> None:
        """The router and every replica down, the replicas up, then the router."""
        self.router.stop()
        for replica in self.replicas:
            replica.restart()
        self.router.start()

    def scale_out(self) -> SimulatorServer:
        """A new replica, added to the router's worker list."""
        replica = self._replica()
        self.replicas.append(replica)
        added = httpx.post(f"{self.router.url}/add_worker", params={"url": replica.url}, timeout=60)
        added.raise_for_status()
        return replica


class FleetRig(Fleet):
    """A :class:`Fleet` warmed by prewarm in this process: the replica watch and the loop run
    here, each plan's batches through the real batch runner."""

    def __init__(
        self, tmp_path: Path, policy: str, count: int, store: Any, store_url: str,
        words: int = 120, **fleet: Any,
    ) -> None:  # fmt: skip
        """``fleet``: the :class:`Fleet`'s other options (``router``, ``capacity_blocks``)."""
        super().__init__(tmp_path, policy, count, words, **fleet)
        self.store = store
        self.settings = Settings(
            redis_url=store_url, store_url=store_url, data_dir=tmp_path / "data",
            fleets=(self.fleet_settings(),), schedule=ScheduleSettings(window_s=60),
        )  # fmt: skip
        self.watcher = Watcher(self.settings, store, warm=self._warm)

    def start(self) -> FleetRig:
        self.start_router()
        self.watcher.poll()  # every replica new: ready (nothing served yet)
        return self

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
            self.warmups.checks.append(check_plan_holdings(settings, self.store, plan.plan_id))
            plans.mark_finished(plan.plan_id)
            return plan.plan_id

        return submit

    def _count(self, result: dict[str, Any], plan: WarmPlan, batch: int, engine: str) -> None:
        items = plan.batches(plan.budget.batch_size)[batch]
        self.warmups.add(result, items, engine, plan.notes)

    # --- scenarios ----------------------------------------------------------------------------

    def rolling_restart(self) -> None:
        for replica in self.replicas:
            replica.restart()
            self.poll()
