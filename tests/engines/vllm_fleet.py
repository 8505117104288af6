"""A fleet of real vLLM CPU replicas behind the real ``vllm-router``, and prewarm running as its
services do, for :mod:`tests.engines.test_vllm_fleet`.

Each replica runs as a current fleet runs it (INFO, no request logging, KV events on, prefix
caching, ``--enable-scale-out`` so the router can render requests into tokens); it keeps its
port and its event endpoints across restarts. prewarm is configured with one ``[[fleets]]``
entry whose replicas carry their KV-event endpoints, and runs as processes: one
``prewarm kv-events`` per replica, ``prewarm watch`` and a real Celery worker. Users send chats
through the router; every measure is read at each replica's own URL (``/metrics``), the router
only carries the users' requests.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.engines.engine import CPU_BLOCK_TOKENS, SERVED_NAME
from benchmarks.engines.kv_vllm import KvEventsVllmServer
from jobs.embedded import free_port
from tasks.adapters.engine_client import samples_from_text
from tests.integration.processes import wait_for
from tests.integration.router import RouterProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
FLEET = "fleet"
#: what a replica's /metrics say about it: prefix-cache lookups (tokens), finished requests,
#: prompt tokens, and its process start time (a restart sets the counters back to 0)
METRICS = {
    "lookups": "vllm:prefix_cache_queries_total",
    "requests": "vllm:request_success_total",
    "tokens": "vllm:prompt_tokens_total",
    "started": "process_start_time_seconds",
}


def replica_metrics(url: str) -> dict[str, float]:
    """:data:`METRICS` of the replica at ``url`` (empty when it does not answer)."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=5).text
    except httpx.TransportError:
        return {}
    samples = samples_from_text(text, frozenset(METRICS.values()))
    return {k: sum(v for n, _, v in samples if n == name) for k, name in METRICS.items()}


@dataclass
class Replica:
    """One vLLM replica and its name in prewarm's settings."""

    server: KvEventsVllmServer

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def name(self) -> str:
        return f"{FLEET}-127.0.0.1-{self.server.port}"

    def restart(self) -> float:
        """Stop and start again on the same ports: an empty cache. Seconds to ready."""
        self.server.stop()
        return self.server.start()


def fleet_toml(router: RouterProcess, metrics_port: int, policy: str,
               replicas: list[Replica]) -> str:  # fmt: skip
    """prewarm's settings: one fleet, its replicas listed with their KV-event endpoints."""
    lines = ["[[fleets]]", f'name = "{FLEET}"', f'router_url = "{router.url}"',
             f'router_metrics_url = "http://127.0.0.1:{metrics_port}/metrics"',
             f'policy = "{policy}"', f'model = "{SERVED_NAME}"', 'replica_kind = "vllm"',
             "max_concurrency = 1", f"cache_block_tokens = {CPU_BLOCK_TOKENS}"]  # fmt: skip
    for r in replicas:
        lines += ["", "[[fleets.replicas]]", f'url = "{r.url}"',
                  f'kv_events = "{r.server.events_endpoint}"',
                  f'kv_replay = "{r.server.replay_endpoint}"']  # fmt: skip
    lines += ["", "[budget]", "max_items = 100", "max_seconds = 300.0", "batch_size = 4",
              "", "[schedule]", "window_s = 60", ""]  # fmt: skip
    return "\n".join(lines)


@dataclass
class Scenario:
    """What one scenario measured: each template's first use through the router (served from
    cache, the replica it landed on) and, per replica, the warm-up requests and prompt tokens
    it served between the restarts and the first uses."""

    name: str
    first: dict[int, tuple[bool, str, int, int]] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    plans: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def hits(self) -> int:
        return sum(hit for hit, *_ in self.first.values())

    def row(self, policy: str, replicas: list[Replica]) -> str:
        per = ", ".join(f"{r.name}: {self.requests.get(r.name, 0)} req / "
                        f"{self.tokens.get(r.name, 0)} tok" for r in replicas)  # fmt: skip
        share = self.hits / max(1, len(self.first))
        return f"| {policy} | {self.name} | {self.hits}/{len(self.first)} ({share:.0%}) | {per} |"


class VllmFleet:
    """Two (``count``) real vLLM replicas behind ``vllm-router`` with ``policy``, and prewarm's
    services for them; see the module docstring."""

    def __init__(self, tmp: Path, policy: str, count: int = 2) -> None:
        self.tmp, self.policy = tmp, policy
        self.replicas = [Replica(KvEventsVllmServer(
            port=free_port(), log_path=tmp / f"replica{i}.log", events_port=free_port(),
            replay_port=free_port(), scale_out=True)) for i in range(count)]  # fmt: skip
        self.metrics_port = free_port()
        kv_args = []
        if policy == "kv_aware":  # the router reads each replica's events (one flag per worker)
            kv_args = ["--kv-event-block-size", str(CPU_BLOCK_TOKENS),
                       "--kv-event-model", SERVED_NAME]  # fmt: skip
            for r in self.replicas:
                kv_args += ["--kv-event-source", f"{r.url}={r.server.events_endpoint}",
                            "--kv-event-replay-source",
                            f"{r.url}={r.server.replay_endpoint}"]  # fmt: skip
        urls = [r.url for r in self.replicas]
        # (its own metrics port, kept across restarts; its routing decisions in its log)
        metrics = ["--prometheus-port", str(self.metrics_port), "--log-level", "debug"]
        self.router = RouterProcess(urls, policy, tmp / "router.log", *metrics, *kv_args)
        self.config = tmp / "prewarm.toml"
        self.config.write_text(fleet_toml(self.router, self.metrics_port, policy, self.replicas))

    # --- engines ------------------------------------------------------------------------------

    def start_replicas(self) -> None:
        """Start every replica at once (each start is mostly waiting on its engine core)."""
        errors: list[BaseException] = []

        def start(r: Replica) -> None:
            try:
                r.server.start()
            except BaseException as exc:  # (re-raised below, in the test's thread)
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(r,)) for r in self.replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def stop(self) -> None:
        self.router.stop()
        for r in self.replicas:
            r.server.stop()

    def logs(self) -> str:
        return "".join(r.server.log_path.read_text(errors="replace") for r in self.replicas)

    # --- prewarm as its services run ------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        """A prewarm process's environment: the test databases, the fleet's settings, a data
        folder of the test's."""
        from benchmarks.stack import prewarm_environment

        env = prewarm_environment(self.config)
        env["PREWARM_DATA_DIR"] = str(self.tmp / "data")
        return env

    @contextmanager
    def running(self, env: dict[str, str], store: Any) -> Iterator[list[Any]]:
        """The replicas, the router, a Celery worker and prewarm's services up, every KV-event
        follower alive (their states yielded); all stopped afterwards."""
        from benchmarks.stack import running_worker
        from tasks.adapters.kv_state import KvStateStore

        try:
            self.start_replicas()
            self.router.start()
            with running_worker(self.tmp / "worker.log", env), self.services(env):
                states = [KvStateStore(store, r.name) for r in self.replicas]
                wait_for(lambda: all(s.alive() for s in states), 120, "kv-events services alive")
                yield states
        finally:
            self.stop()

    @contextmanager
    def services(self, env: dict[str, str]) -> Iterator[None]:
        """``prewarm kv-events`` per replica and ``prewarm watch`` (every 2 s), as processes."""
        with ExitStack() as stack:
            for r in self.replicas:
                stack.enter_context(self._process(env, f"kv-{r.server.port}",
                                                  "kv-events", "--engine", r.name))  # fmt: skip
            stack.enter_context(self._process(env, "watch", "watch", "--interval", "2"))
            yield

    @contextmanager
    def _process(self, env: dict[str, str], log: str, *args: str) -> Iterator[None]:
        cmd = [sys.executable, "-c", "from jobs.cli import main; main()", *args]
        with (self.tmp / f"{log}.log").open("ab") as out:
            proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=out,
                                    stderr=subprocess.STDOUT)  # fmt: skip
        try:
            yield
        finally:
            proc.terminate()
            proc.wait(30)

    # --- measures -------------------------------------------------------------------------------

    def metrics(self) -> dict[str, dict[str, float]]:
        return {r.name: replica_metrics(r.url) for r in self.replicas}

    def served_since(self, before: dict[str, dict[str, float]]) -> tuple[dict, dict]:
        """Requests and prompt tokens each replica served since ``before`` (a replica that
        restarted since counts from 0)."""
        now = self.metrics()
        requests, tokens = {}, {}
        for name, m in now.items():
            old = before.get(name, {})
            same = old.get("started") == m.get("started")
            requests[name] = int(m.get("requests", 0) - (old.get("requests", 0) if same else 0))
            tokens[name] = int(m.get("tokens", 0) - (old.get("tokens", 0) if same else 0))
        return requests, tokens

    # --- users ----------------------------------------------------------------------------------

    def chat(self, system: str, question: str) -> tuple[int, int]:
        """One user's chat through the router: (cached, prompt) tokens."""
        body = {"model": SERVED_NAME, "max_tokens": 1,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": question}]}  # fmt: skip
        answer = httpx.post(f"{self.router.url}/v1/chat/completions", json=body, timeout=300)
        answer.raise_for_status()
        usage = answer.json()["usage"]
        return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0), int(
            usage["prompt_tokens"]
        )

    def traffic(self, templates: list[str], uses: int, users: int = 2) -> None:
        """Every template used ``uses`` times, by ``users`` users at once (each its share of the
        templates), so the router places templates on every replica."""

        def user(k: int) -> None:
            for round_ in range(uses):
                for n in range(k, len(templates), users):
                    self.chat(templates[n], f"Question {round_} about case {n}?")

        threads = [threading.Thread(target=user, args=(k,)) for k in range(users)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def first_uses(self, templates: list[str], tag: str) -> dict[int, tuple[bool, str, int, int]]:
        """One new chat per template, one at a time: (served from cache, the replica whose
        lookups counted it, cached tokens, prompt tokens)."""
        out = {}
        for n, system in enumerate(templates):
            before = {k: m.get("lookups", 0.0) for k, m in self.metrics().items()}
            cached, prompt = self.chat(system, f"{tag}: a first question on case {n}?")
            after = {k: m.get("lookups", 0.0) for k, m in self.metrics().items()}
            landed = [k for k in after if after[k] > before.get(k, 0.0)]
            out[n] = (cached >= prompt // 2, landed[0] if len(landed) == 1 else "?", cached,
                      prompt)  # fmt: skip
        return out

    # --- prewarm's plans ------------------------------------------------------------------------

    def plan_ids(self, store: Any) -> set[str]:
        """Every plan prewarm submitted for a replica that is still known: the watch's (the
        loop keeps each engine's recent plans) and the KV-event followers' last restores."""
        from tasks.adapters import redis_keys
        from tasks.adapters.kv_state import KvStateStore

        ids = set()
        for r in self.replicas:
            key = redis_keys.LOOP_PLAN_IDS.format(engine=r.name)
            ids |= {p.decode() if isinstance(p, bytes) else p for p in store.lrange(key, 0, -1)}
            restore = KvStateStore(store, r.name).status().get("last_restore")
            ids |= {restore} if restore else set()
        return ids

    def settle(self, store: Any, settings: Any, known: set[str], quiet_s: float = 15.0,
               timeout_s: float = 600.0) -> list[dict[str, Any]]:  # fmt: skip
        """Wait until prewarm is done warming: every plan it submitted since ``known`` finished,
        and none new or running for ``quiet_s`` (the watch looks every 2 s; a cold-cache trigger
        needs two looks after a restart). Returns those plans' reports."""
        from tasks.warm_tasks import plan_report

        deadline = time.monotonic() + timeout_s
        seen: set[str] = set()
        busy = time.monotonic()
        while time.monotonic() < deadline:
            new = self.plan_ids(store) - known - seen
            seen |= new
            reports = {p: _report(plan_report, p, settings) for p in seen}
            if new or not all(r["done"] for r in reports.values()):
                busy = time.monotonic()
            elif time.monotonic() - busy > quiet_s:
                return [{"plan": p, **r} for p, r in reports.items()]
            time.sleep(1.0)
        raise AssertionError(f"prewarm still warming after {timeout_s:.0f}s: {seen}")


def _report(plan_report: Callable[..., dict[str, Any]], plan_id: str, settings: Any) -> dict:
    """A plan's report; one no longer in the store (it was deleted under the test) is done,
    and says so."""
    from pipeline.errors import BadInputError

    try:
        return plan_report(plan_id, settings=settings)
    except BadInputError as exc:
        return {"done": True, "state": f"gone: {exc}"}
