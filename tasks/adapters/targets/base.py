"""What every warm-up target shares: options, the batch context, per-item results.

A target turns items of one kind into effects on a cache: ``apply`` records each effect in the
WAL before it happens and performs it; ``verify`` checks what was applied before the batch
commits. Targets never raise for one bad item — the item fails, and the batch decides by its
failure ratio.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from pipeline.wal import Effect
from tasks.adapters.engine_client import Completion, EngineClient
from tasks.adapters.gateway_client import GatewayClient, GatewayLog
from tasks.adapters.wal_store import RedisWrite, WalStore


@dataclass
class RoutedFleet:
    """The road of a fleet whose router remembers what it routed: its router (a client at the
    router's URL sending no header of prewarm's) and every replica at its own URL, whose
    ``/metrics`` say where each prime landed."""

    router: EngineClient
    replicas: dict[str, EngineClient]
    #: the router keys its memory on a request's text (sglang-router's ``cache_aware``): a
    #: prefix rendered from a chat is primed as that chat (:mod:`pipeline.chat_forms`)
    text_keyed: bool = False
    #: the router restarted (its memory is empty): primes go in groups at once first, so it
    #: places them by load over the replicas (:func:`tasks.adapters.targets.routed.spread`)
    spread: bool = False

    def lookups(self) -> dict[str, float | None]:
        """Each replica's prefix-cache lookups so far (tokens; None: it publishes none)."""
        return {name: client.prefix_cache_queries() for name, client in self.replicas.items()}


@dataclass(frozen=True, slots=True)
class WarmOptions:
    """How a plan is executed; stored with the plan in Redis (messages carry ids only)."""

    batch_size: int | None = None
    apply_chunk: int = 0  # items per WAL step inside a batch; 0 = the whole batch at once
    verify: bool = True
    max_failure_ratio: float = 0.5
    retry_attempts: int = 3
    retry_base_s: float = 0.05
    timeout_s: float = 30.0
    ttft_drop: float = 0.3
    prompts_per_request: int = 32  # text prefixes primed per /v1/completions request
    min_cached_share: float = 0.5  # of a probed group's prompt tokens that must be cached
    ordered: bool = False
    #: a fleet replica's road when not its policy's ("": the policy's; ``WarmPlan.road``)
    road: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> WarmOptions:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in (data or {}).items() if k in known})


@dataclass
class ItemResult:
    """Outcome of one item in a batch."""

    key: str
    kind: str
    ok: bool = True
    detail: str = ""
    prime: Completion | None = None
    value: str | None = None
    redis_key: str | None = None
    #: "prime" (the engine's accounting on it), "probe", "gateway" (a repeat answered from the
    #: gateway's cache) or "already cached" (the gateway answered the warm-up itself)
    verified_by: str = ""
    gateway_key: str | None = None  # the key the gateway named for the entry
    #: the fleet replica a prime sent through the router landed on ("" when not routed)
    replica: str = ""

    def fail(self, detail: str) -> None:
        self.ok, self.detail = False, detail


@dataclass
class BatchContext:
    """A batch's view of the world: WAL (or none), store, engine client, options."""

    store: redis.Redis
    engine: EngineClient
    options: WarmOptions
    wal: WalStore | None = None
    txn_id: str = ""
    owner: str = ""
    adapter_paths: dict[str, str] = field(default_factory=dict)
    requests_at_start: int = 0
    seq: int = 0
    gateways: dict[str, GatewayClient] = field(default_factory=dict)
    #: gateway name → its request log (the engine's ``litellm`` sources)
    gateway_logs: dict[str, GatewayLog] = field(default_factory=dict)
    sleep: Callable[[float], None] = time.sleep

    def gateway_log(self, name: str) -> GatewayLog:
        """The request log of gateway ``name`` (an empty one when no source names it)."""
        return self.gateway_logs.get(name) or GatewayLog(())

    #: a fleet whose router remembers what it routed: prefixes go through it (see ``routed``)
    routed: RoutedFleet | None = None

    @property
    def group_size(self) -> int:
        """Prompts per priming request; engines without list prompts or cached-token counts
        (llama.cpp, TGI) get one, so every probe speaks for exactly one prefix."""
        grouping = self.engine.engine.kind in ("vllm", "simulator")
        return max(1, self.options.prompts_per_request) if grouping else 1

    def record(self, effects: Sequence[Effect]) -> None:
        """Write engine-effect records before the effects (no-op without a WAL)."""
        if self.wal is not None:
            self.seq = self.wal.record(self.txn_id, self.owner, effects)

    def next_seq(self) -> int:
        """Sequence number of the next effect record (this worker is the only writer)."""
        return self.seq

    def apply_redis(self, writes: Sequence[RedisWrite]) -> None:
        """Before-images + records + writes in one MULTI (plain writes without a WAL)."""
        if self.wal is not None:
            self.seq = self.wal.apply_redis(self.txn_id, self.owner, writes)
            return
        with self.store.pipeline() as pipe:
            for w in writes:
                pipe.set(w.key, w.value or "", ex=w.ttl_s or None)
            pipe.execute()
