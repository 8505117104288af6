"""Prometheus metrics under vLLM's names, one registry per simulator so servers never mix."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# vLLM V1's buckets for time-to-first-token (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)

_LABELS = ("model_name", "engine")


class EngineMetrics:
    """The simulator's metrics, labelled like vLLM's (``model_name``, ``engine``).

    Attributes are the labelled children, ready to ``inc``/``set``/``observe``; every series
    exists from the start, at zero, as on a freshly started vLLM.
    """

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        self.model = model
        self.prefix_cache_queries = self._counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_cache_hits = self._counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.prompt_tokens = self._counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        )
        self.generation_tokens = self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.running = self._gauge("vllm:num_requests_running", "Requests in model execution.")
        self.waiting = self._gauge("vllm:num_requests_waiting", "Requests waiting to be processed.")
        self.kv_usage = self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent."
        )
        self.ttft = self._histogram(
            "vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS
        )
        self.e2e = self._histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self._success = Counter(
            "vllm:request_success", "Count of successfully processed requests.",
            (*_LABELS, "finished_reason"), registry=self.registry,
        )  # fmt: skip
        self._identity()

    def _identity(self) -> None:
        """Start time (a restarted replica shows a new one) and the simulator's own marker."""
        start = Gauge(
            "process_start_time_seconds",
            "Start time of the (simulated) engine since unix epoch in seconds.",
            registry=self.registry,
        )
        start.set(time.time())
        info = Gauge(
            "prewarm_simulator_info", "1: these metrics come from the prewarm engine SIMULATOR.",
            ("model_name",), registry=self.registry,
        )  # fmt: skip
        info.labels(self.model).set(1)

    def _counter(self, name: str, doc: str) -> Counter:
        return Counter(name, doc, _LABELS, registry=self.registry).labels(self.model, "0")

    def _gauge(self, name: str, doc: str) -> Gauge:
        return Gauge(name, doc, _LABELS, registry=self.registry).labels(self.model, "0")

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        family = Histogram(name, doc, _LABELS, buckets=buckets, registry=self.registry)
        return family.labels(self.model, "0")

    def cache_config(self, block_size: int, blocks: int) -> None:
        """Publish the cache's size as vLLM does (``vllm:cache_config_info``, its labels the
        cache config): what prewarm reads a replica's real capacity from."""
        info = Gauge(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
            ("block_size", "enable_prefix_caching", "num_gpu_blocks"), registry=self.registry,
        )  # fmt: skip
        info.labels(str(block_size), "True", str(blocks)).set(1)

    def finished(self, reason: str) -> None:
        """Count one finished request by its finish reason (``stop``, ``length``, ``abort``)."""
        self._success.labels(self.model, "0", reason).inc()

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)
