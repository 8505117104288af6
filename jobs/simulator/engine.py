"""The simulated engine: prefix cache, latency model, outputs, metrics and logs for a request.

A request is prepared (prompt cut into pseudo-tokens and whole blocks), then prefilled (it waits
for a running slot, looks its block chain up in the cache and sleeps for the tokens it must
compute), then decoded token by token. Only uncached tokens pay prefill, so a warmed prefix
gives a measurably lower time to first token — the effect prewarm exists for.
"""

from __future__ import annotations

import asyncio
import functools
import random
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from jobs.simulator.cache import BlockPrefixCache
from jobs.simulator.kv_publisher import KvEventPublisher, removed_event, stored_event
from jobs.simulator.metrics import EngineMetrics
from jobs.simulator.outputs import SimulatedToken, generate_tokens, natural_length, token_id
from jobs.simulator.vllm_log import SamplingParamsView, VllmLogWriter, lora_request_repr
from pipeline.prefix_blocks import block_hashes_from_ids, pseudo_tokens


@dataclass(frozen=True)
class LatencyModel:
    """Per-token prefill and decode cost; zero everywhere is the no-latency benchmark mode."""

    prefill_ms_per_token: float = 0.0
    decode_ms_per_token: float = 0.0
    overhead_ms: float = 0.0

    def prefill_s(self, uncached_tokens: int) -> float:
        """Seconds to compute ``uncached_tokens`` of prompt plus the per-request overhead."""
        return (self.overhead_ms + uncached_tokens * self.prefill_ms_per_token) / 1000.0

    def decode_s(self) -> float:
        """Seconds per generated token after the first."""
        return self.decode_ms_per_token / 1000.0


@dataclass
class FaultInjection:
    """Failures to inject into generation requests (tests only); mutable while serving."""

    error_rate: float = 0.0
    delay_s: float = 0.0
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def should_fail(self) -> bool:
        """Whether the next request is answered with an HTTP 500."""
        return self.error_rate > 0 and self._rng.random() < self.error_rate


@dataclass
class SimulatorConfig:
    """Everything a simulated engine is started with."""

    model: str = "sim-llm"
    block_size: int = 16
    capacity_blocks: int = 4096
    latency: LatencyModel = field(default_factory=LatencyModel)
    max_model_len: int = 32_768
    max_num_seqs: int = 64
    stats_interval_s: float = 10.0
    adapter_load_ms: float = 0.0
    log_file: Path | None = None
    faults: FaultInjection = field(default_factory=FaultInjection)
    #: KV-cache events in vLLM's wire format: PUB endpoint, ROUTER replay endpoint, form.
    kv_events_endpoint: str | None = None
    kv_replay_endpoint: str | None = None
    kv_events_form: Literal["map", "array"] = "map"


class ModelNotFoundError(LookupError):
    """The request names a model that is neither the base model nor a loaded adapter."""


class PromptTooLongError(ValueError):
    """The prompt plus the requested output do not fit the model's context."""


@dataclass(frozen=True, slots=True)
class Adapter:
    """A loaded LoRA adapter."""

    name: str
    int_id: int
    path: str


@dataclass
class GenerationRequest:
    """A request as the engine sees it: prompt text (or ids), sampling params, adapter."""

    request_id: str
    model: str
    prompt: str | None
    params: SamplingParamsView
    prompt_token_ids: list[int] | None = None
    adapter: Adapter | None = None
    natural_stop: bool = True
    cache_salt: str | None = None


@functools.lru_cache(maxsize=4096)
def _text_tokens(prompt: str, block_size: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Token ids and block chain of a prompt; memoised, as a probe repeats its priming prompt.

    The chain is hashed from the token ids, as an engine hashes them, so a prompt sent as text
    and the same prompt sent as its token ids share their cached blocks."""
    ids = tuple(map(token_id, pseudo_tokens(prompt)))
    return ids, tuple(block_hashes_from_ids(ids, block_size))


def reusable_blocks(prompt_tokens: int, block_size: int) -> int:
    """Whole blocks a prompt may hit: vLLM always recomputes the last prompt token."""
    return (prompt_tokens - 1) // block_size if prompt_tokens else 0


def _check_context(prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    """vLLM's refusals (same wording) of a prompt, or prompt plus output, over the context."""
    if prompt_tokens >= max_model_len:
        raise PromptTooLongError(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains at least {prompt_tokens} input tokens, which exceeds this limit "
            "even without any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={prompt_tokens})"
        )
    if prompt_tokens + max_tokens > max_model_len:
        raise PromptTooLongError(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {max_tokens} output tokens and your prompt contains at least "
            f"{prompt_tokens} input tokens, for a total of at least {prompt_tokens + max_tokens} "
            "tokens. Please reduce the length of the input prompt or the number of requested "
            f"output tokens. (parameter=max_tokens, value={max_tokens})"
        )


class StatsWindow:
    """Token counts since the last stats line, and hit rate over recent requests (as vLLM)."""

    def __init__(self) -> None:
        self.since = time.monotonic()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.recent: deque[tuple[int, int]] = deque(maxlen=1000)

    def hit_rate(self) -> float:
        queried = sum(q for q, _ in self.recent)
        return 100.0 * sum(h for _, h in self.recent) / queried if queried else 0.0


class SimulatedEngine:
    """One simulated replica: cache, adapters, metrics, logs. Used from one event loop."""

    def __init__(self, config: SimulatorConfig, log: VllmLogWriter) -> None:
        self.config = config
        self.log = log
        self.cache = BlockPrefixCache(config.capacity_blocks)
        self.metrics = EngineMetrics(config.model)
        self.metrics.cache_config(config.block_size, config.capacity_blocks)
        self.adapters: dict[str, Adapter] = {}
        self.stats = StatsWindow()
        self.running = 0
        self.waiting = 0
        self._slots: asyncio.Semaphore | None = None
        self._next_adapter_id = 1
        self.kv_events: KvEventPublisher | None = None
        if config.kv_events_endpoint is not None:
            self.kv_events = KvEventPublisher(
                config.kv_events_endpoint, config.kv_replay_endpoint, form=config.kv_events_form
            )

    def close(self) -> None:
        """Stop publishing KV-cache events (frees their ports)."""
        if self.kv_events is not None:
            self.kv_events.close()

    # -- models and adapters -------------------------------------------------------------

    def resolve_model(self, name: str | None) -> Adapter | None:
        """The adapter a request's ``model`` names (``None`` for the base model)."""
        if name is None or name == self.config.model:
            return None
        if name in self.adapters:
            return self.adapters[name]
        raise ModelNotFoundError(
            f"The model `{name}` does not exist. Valid aliases: {self.config.model}."
        )

    def add_adapter(self, name: str, path: str) -> Adapter:
        """Register a LoRA adapter under ``name`` (the caller checks for duplicates)."""
        adapter = Adapter(name, self._next_adapter_id, path)
        self._next_adapter_id += 1
        self.adapters[name] = adapter
        return adapter

    # -- one request ---------------------------------------------------------------------

    def prepare(self, request: GenerationRequest) -> Generation:
        """Tokenise, check the context length, log the request and return its generation."""
        if request.prompt is not None:
            token_ids, hashes = _text_tokens(request.prompt, self.config.block_size)
            ids, chain = list(token_ids), list(hashes)
        else:
            ids = list(request.prompt_token_ids or [])
            chain = block_hashes_from_ids(ids, self.config.block_size)
        if request.adapter is not None:
            chain = [f"{request.adapter.name}/{h}" for h in chain]  # adapters never share KV
        if request.cache_salt:
            chain = [f"salt:{request.cache_salt}/{h}" for h in chain]  # vLLM's cache_salt
        _check_context(len(ids), request.params.max_tokens, self.config.max_model_len)
        lora = request.adapter
        lora_text = lora_request_repr(lora.name, lora.int_id, lora.path) if lora else None
        self.log.request(request.request_id, request.prompt, ids, request.params, lora_text)
        return Generation(self, request, ids, chain)

    def slots(self) -> asyncio.Semaphore:
        """Running slots (``max_num_seqs``), created in the serving event loop."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.config.max_num_seqs)
        return self._slots

    def reset_prefix_cache(self) -> int:
        """Drop every cached block; returns how many were dropped."""
        if self.kv_events is not None:
            self.kv_events.cleared()
        return self.cache.clear()

    def store_blocks(self, generation: Generation) -> None:
        """Cache a prefilled prompt's blocks; publish what was stored and what was evicted."""
        chain, cache = generation.chain, self.cache
        fresh = [i for i, h in enumerate(chain) if h not in cache]
        evicted = cache.insert(chain)
        if self.kv_events is None:
            return
        request, size = generation.request, self.config.block_size
        lora = (request.adapter.name, request.adapter.int_id) if request.adapter else None
        runs = [i for n, i in enumerate(fresh) if n == 0 or fresh[n - 1] != i - 1]
        ends = [i + 1 for n, i in enumerate(fresh) if n + 1 == len(fresh) or fresh[n + 1] != i + 1]
        events: list = [
            stored_event(chain, generation.ids, start, end, size, lora, request.cache_salt)
            for start, end in zip(runs, ends, strict=True)
        ]
        if evicted:
            events.append(removed_event(evicted))
        self.kv_events.publish(events)

    def stats_line(self) -> tuple[str, bool]:
        """The periodic stats message and whether the interval was idle."""
        now = time.monotonic()
        elapsed = max(now - self.stats.since, 1e-9)
        prompt_tps = self.stats.prompt_tokens / elapsed
        gen_tps = self.stats.generation_tokens / elapsed
        idle = self.stats.prompt_tokens == 0 and self.stats.generation_tokens == 0
        idle = idle and self.running == 0 and self.waiting == 0
        line = (
            f"Engine 000: Avg prompt throughput: {prompt_tps:.1f} tokens/s, "
            f"Avg generation throughput: {gen_tps:.1f} tokens/s, Running: {self.running} reqs, "
            f"Waiting: {self.waiting} reqs, GPU KV cache usage: {100 * self.cache.usage:.1f}%, "
            f"Prefix cache hit rate: {self.stats.hit_rate():.1f}%"
        )
        self.stats.since, self.stats.prompt_tokens, self.stats.generation_tokens = now, 0, 0
        return line, idle

    def log_stats(self) -> None:
        """Write one stats line now."""
        line, idle = self.stats_line()
        self.log.stats(line, idle=idle)


class Generation:
    """One request's life in the engine: wait for a slot, prefill, decode, finish."""

    def __init__(
        self, engine: SimulatedEngine, request: GenerationRequest, ids: list[int], chain: list[str]
    ) -> None:
        self.engine = engine
        self.request = request
        self.prompt_tokens = len(ids)
        self.ids = ids
        self.chain = chain
        self.cached_tokens = 0
        self.ttft_s = 0.0
        self.finish_reason: str | None = None
        self.tokens = self._plan_tokens()
        self.engine_request_id = f"{request.request_id}-{secrets.token_hex(4)}"
        self.done = False
        self._started = time.monotonic()
        self._holding_slot = False

    def _plan_tokens(self) -> list[SimulatedToken]:
        params, request = self.request.params, self.request
        seed_text = request.prompt if request.prompt is not None else str(request.prompt_token_ids)
        model = request.adapter.name if request.adapter else request.model
        count = params.max_tokens
        if request.natural_stop and not params.ignore_eos:
            natural = natural_length(seed_text, model, params.seed)
            count = min(count, max(natural, params.min_tokens))
        self.finish_reason = "length" if count == params.max_tokens else "stop"
        return generate_tokens(
            seed_text, model, count=count, seed=params.seed, top_n=params.logprobs or 0
        )

    async def prefill(self) -> None:
        """Wait for a running slot, then compute the uncached part of the prompt."""
        engine = self.engine
        engine.log.added(self.engine_request_id)  # a streamed response has started by now
        engine.waiting += 1
        engine.metrics.waiting.set(engine.waiting)
        try:
            await engine.slots().acquire()
        finally:
            engine.waiting -= 1
            engine.metrics.waiting.set(engine.waiting)
        self._holding_slot = True
        engine.running += 1
        engine.metrics.running.set(engine.running)
        # Lookup stops short of the last token; every computed whole block is stored after.
        hit = engine.cache.lookup(
            self.chain[: reusable_blocks(self.prompt_tokens, engine.config.block_size)]
        )
        self.cached_tokens = hit.hit_blocks * engine.config.block_size
        await _sleep(engine.config.latency.prefill_s(self.prompt_tokens - self.cached_tokens))
        engine.store_blocks(self)
        self.ttft_s = time.monotonic() - self._started
        self._record_prefill()

    def _record_prefill(self) -> None:
        metrics, engine = self.engine.metrics, self.engine
        metrics.prefix_cache_queries.inc(self.prompt_tokens)
        metrics.prefix_cache_hits.inc(self.cached_tokens)
        metrics.prompt_tokens.inc(self.prompt_tokens)
        metrics.ttft.observe(self.ttft_s)
        metrics.kv_usage.set(engine.cache.usage)
        engine.stats.prompt_tokens += self.prompt_tokens
        engine.stats.recent.append((self.prompt_tokens, self.cached_tokens))

    async def stream(self) -> AsyncIterator[SimulatedToken]:
        """Yield the output tokens at the decode rate (the first comes with the prefill)."""
        for position, token in enumerate(self.tokens):
            if position:
                await _sleep(self.engine.config.latency.decode_s())
            self.engine.metrics.generation_tokens.inc()
            self.engine.stats.generation_tokens += 1
            yield token

    def finish(self, *, aborted: bool = False) -> None:
        """Release the slot and count the request; idempotent."""
        self.done = True
        if not self._holding_slot:
            return
        self._holding_slot = False
        engine = self.engine
        engine.slots().release()
        engine.running -= 1
        engine.metrics.running.set(engine.running)
        engine.metrics.e2e.observe(time.monotonic() - self._started)
        engine.metrics.finished("abort" if aborted else (self.finish_reason or "stop"))


async def _sleep(seconds: float) -> None:
    if seconds > 0:
        await asyncio.sleep(seconds)
