"""HTTP client of one engine's OpenAI-compatible API, for warm-up requests.

The base URL comes only from settings (``EngineSettings.url``), never from a plan. Transient
failures (connection errors, timeouts, HTTP 5xx and 429) are retried with exponential backoff
and full jitter, then raised as :class:`EngineUnavailableError`; other 4xx are bad input.
Every request carries an ``X-Request-Id`` of prewarm's own (:mod:`pipeline.own_requests`), so
the loop does not read its own warm-ups back from the engine's log as demand.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from pipeline.errors import BadInputError, EngineUnavailableError
from pipeline.own_requests import own_request_id
from pipeline.planner.plan import WarmItem
from tasks.adapters.connections import tls_context
from tasks.settings import EngineSettings


@dataclass(frozen=True, slots=True)
class Completion:
    """What a warm-up request learned: output, cache use, timing."""

    text: str
    prompt_tokens: int
    cached_tokens: int | None
    elapsed_s: float
    #: the engine's id of the request (its response's ``id``), as its log names it
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries: ``attempts`` tries, sleeping ``base_s·2^n`` (full jitter) in between."""

    attempts: int = 3
    base_s: float = 0.05
    cap_s: float = 2.0

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.cap_s, self.base_s * 2**attempt))


class EngineError(BadInputError):
    """The engine refused a request as malformed (HTTP 4xx other than 429)."""

    def __init__(self, message: str, status: int, where: str) -> None:
        self.status = status
        super().__init__(message, where=where)


class EngineClient:
    """Warm-up calls to one configured engine over a pooled keep-alive connection."""

    def __init__(
        self,
        engine: EngineSettings,
        *,
        timeout_s: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),
        transport: httpx.BaseTransport | None = None,
        base_url: str | None = None,
        request_ids: bool = True,
    ) -> None:
        self.engine = engine
        self.retry = retry
        #: whether requests carry prewarm's own ``X-Request-Id``: not through a router, whose
        #: choice may hang on that header (vllm-router's ``consistent_hash`` keys on it), where
        #: warm-ups go exactly as users send them
        self.request_ids = request_ids
        self.http = httpx.Client(
            base_url=base_url or engine.url,
            timeout=timeout_s,
            transport=transport,
            limits=httpx.Limits(max_connections=engine.max_concurrency),
            verify=tls_context(),
        )
        self.requests = 0

    def close(self) -> None:
        self.http.close()

    def post(self, path: str, payload: Mapping[str, Any]) -> httpx.Response:
        """POST with retries on transient failures; 4xx other than 429 raise at once."""
        for attempt in range(self.retry.attempts):
            try:
                self.requests += 1
                headers = (
                    {"X-Request-Id": own_request_id(uuid.uuid4().hex)} if self.request_ids else {}
                )
                response = self.http.post(path, json=dict(payload), headers=headers)
            except httpx.TransportError as exc:
                failure = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code < 400:
                    return response
                if response.status_code < 500 and response.status_code != 429:
                    raise EngineError(response.text[:200], response.status_code, self._where(path))
                failure = f"HTTP {response.status_code}"
            if attempt + 1 < self.retry.attempts:
                time.sleep(self.retry.delay(attempt))
        raise EngineUnavailableError(f"{self._where(path)}: {failure} after retries")

    def _where(self, path: str) -> str:
        return f"engine {self.engine.name} {path}"

    def complete(self, item: WarmItem, max_tokens: int = 1) -> Completion:
        """One request for ``item``'s prompt, through the chat route when it has messages."""
        payload: dict[str, Any] = {
            **item.params,
            # set last: a plan's fields never override the model, length or greedy sampling
            "model": item.adapter or self.engine.model,
            "max_tokens": max_tokens,
            "temperature": 0.0,
        }
        self._salt(payload, item)
        chat = item.messages is not None
        if chat:
            payload["messages"] = [dict(m) for m in item.messages or ()]
        else:
            payload["prompt"] = _prompt(item)
        started = time.perf_counter()
        body = self.post("/v1/chat/completions" if chat else "/v1/completions", payload).json()
        return _completion(body, time.perf_counter() - started, chat)

    def complete_many(self, items: list[WarmItem], max_tokens: int = 1) -> Completion:
        """One ``/v1/completions`` request for several text prompts (a list ``prompt``).

        The items must share model and extra parameters; usage comes back summed over them.
        """
        first = items[0]
        payload: dict[str, Any] = {
            **first.params,
            "model": first.adapter or self.engine.model,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "prompt": [_prompt(item) for item in items],
        }
        self._salt(payload, first)
        started = time.perf_counter()
        body = self.post("/v1/completions", payload).json()
        return _completion(body, time.perf_counter() - started, chat=False)

    def _salt(self, payload: dict[str, Any], item: WarmItem) -> None:
        """With tenant isolation, every request carries its tenant's ``cache_salt`` — also for
        plans that were not built with :func:`pipeline.planner.plan.with_cache_salt`."""
        if self.engine.tenant_isolation:
            payload.setdefault("cache_salt", item.tenant)

    def loaded_models(self) -> set[str]:
        """Model ids the engine serves now (base model and loaded adapters)."""
        response = self.http.get("/v1/models")
        if response.status_code >= 400:
            raise EngineUnavailableError(f"{self._where('/v1/models')}: {response.status_code}")
        return {card["id"] for card in response.json().get("data", [])}

    def metric_samples(self, names: frozenset[str]) -> list[tuple[str, dict[str, str], float]]:
        """Samples named in ``names`` from the engine's ``/metrics`` as (name, labels, value);
        empty when the engine has no metrics route or does not answer with Prometheus text."""
        try:  # (a replica's own metrics endpoint, never a router's: see EngineSettings)
            response = self.http.get(self.engine.metrics_url or "/metrics")
        except httpx.TransportError:
            return []
        if response.status_code >= 400:
            return []
        return samples_from_text(response.text, names)

    def prefix_cache_queries(self) -> float | None:
        """``vllm:prefix_cache_queries_total`` from the engine's ``/metrics`` (tokens looked up in
        its prefix cache so far), or None when the engine publishes no such counter. vLLM counts
        lookups only while prefix caching is on, so a count above 0 says the cache keeps what the
        engine computes."""
        samples = self.metric_samples(frozenset({"vllm:prefix_cache_queries_total"}))
        return sum(value for _, _, value in samples) if samples else None

    def cache_config(self) -> dict[str, str] | None:
        """The labels of vLLM's ``vllm:cache_config_info`` (``block_size``, ``num_gpu_blocks``,
        ``enable_prefix_caching``, ...), or None when the engine publishes none."""
        samples = self.metric_samples(frozenset({"vllm:cache_config_info"}))
        return samples[0][1] if samples else None

    def load_adapter(self, name: str, path: str) -> None:
        self.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload_adapter(self, name: str) -> None:
        """Unload ``name``; an adapter already gone counts as done (undo is idempotent)."""
        try:
            self.post("/v1/unload_lora_adapter", {"lora_name": name})
        except EngineError as exc:
            if exc.status not in (400, 404):
                raise


def _prompt(item: WarmItem) -> str | list[int] | None:
    """A text prompt, or the exact token ids of a prefix learned from KV-cache events."""
    return list(item.token_ids) if item.token_ids is not None else item.text


def _completion(body: Mapping[str, Any], elapsed: float, chat: bool) -> Completion:
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    choice = (body.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") if chat else choice.get("text")
    return Completion(
        text=text or "",
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_tokens=details.get("cached_tokens"),
        elapsed_s=elapsed,
        request_id=str(body.get("id") or ""),
    )


def samples_from_text(text: str, names: frozenset[str]) -> list[tuple[str, dict[str, str], float]]:
    """Samples named in ``names`` from Prometheus text as (name, labels, value); empty when the
    text is not Prometheus text. Only the wanted samples' lines go to the parser: an engine's
    ``/metrics`` is mostly histogram buckets, and a warm-up batch reads it once."""
    from prometheus_client.parser import text_string_to_metric_families

    prefixes = tuple(names)
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(prefixes))
    try:
        return [
            (sample.name, dict(sample.labels), sample.value)
            for family in text_string_to_metric_families(wanted + "\n")
            for sample in family.samples
            if sample.name in names
        ]
    except ValueError:  # not Prometheus text
        return []
