"""HTTP client of a gateway (LiteLLM's proxy), the Redis it caches in, and its request log.

Warm-ups go through the proxy exactly as its clients send them (the recorded request, to the
route of its endpoint, with the configured key): the gateway computes its own cache key and
stores its own answer, so prewarm never rebuilds LiteLLM's key. Every request carries a
``prewarm-…`` ``X-Request-Id`` (:mod:`pipeline.own_requests`), which prewarm's callback writes
to the gateway's log, so the loop leaves its own warm-ups out of the demand it reads there.

The gateway's word on a cache hit: a chat or completions answer from its cache carries the
``x-litellm-cache-key`` header; an embeddings answer carries none, so its hit is read from the
gateway's request log (the line of the request's id, ``cache_hit: true``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

from pipeline.errors import BadInputError, EngineUnavailableError
from pipeline.gateway_log import LOG_TAG
from pipeline.own_requests import own_request_id
from tasks.settings import GatewaySettings

CACHE_KEY_HEADER = "x-litellm-cache-key"
_ROUTES = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}


@dataclass(frozen=True, slots=True)
class GatewayAnswer:
    """What one request through the gateway learned: its id, and the cache key the gateway
    named when it answered from its cache (None: it asked the engine)."""

    request_id: str
    cache_key: str | None
    #: the answer's ``id``: an answer from a cache carries the id of the answer it stored, so
    #: it names the entry that answered
    response_id: str | None = None


class GatewayError(BadInputError):
    """The gateway refused a request (HTTP 4xx other than 429: a bad key, an unknown model)."""


class GatewayClient:
    """Calls to one configured gateway over a pooled keep-alive connection."""

    def __init__(
        self, gateway: GatewaySettings, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.gateway = gateway
        key = gateway.key.get_secret_value() if gateway.key else None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(
            base_url=gateway.url, timeout=gateway.timeout_s, transport=transport, headers=headers
        )
        self.cache = redis.Redis.from_url(gateway.cache_url) if gateway.cache_url else None
        self.requests = 0

    def close(self) -> None:
        self.http.close()

    def send(self, endpoint: str, body: Mapping[str, Any], *, store: bool = True) -> GatewayAnswer:
        """Send ``body`` to ``endpoint``'s route as a client would; with ``store`` False the
        gateway may answer from its cache but keeps nothing of this request (LiteLLM's
        per-request ``cache: {"no-store": true}``, outside its cache key)."""
        route = _ROUTES.get(endpoint)
        if route is None:
            raise BadInputError(f"no gateway route for endpoint {endpoint!r}", where="endpoint")
        request_id = own_request_id(uuid.uuid4().hex)
        sent = dict(body) if store else {**body, "cache": {"no-store": True}}
        response = self._post(route, sent, {"X-Request-Id": request_id})
        return GatewayAnswer(request_id, response.headers.get(CACHE_KEY_HEADER) or None,
                             _answer_id(response))  # fmt: skip

    def embed(self, model: str, texts: Sequence[str]) -> list[list[float]]:
        """The gateway's embeddings of ``texts`` by its model group ``model`` (nothing stored
        or read in its cache)."""
        body = {"model": model, "input": list(texts), "cache": {"no-store": True, "no-cache": True}}
        request_id = own_request_id(uuid.uuid4().hex)
        response = self._post(_ROUTES["embeddings"], body, {"X-Request-Id": request_id})
        try:
            data = sorted(response.json()["data"], key=lambda d: d["index"])
            vectors = [list(map(float, d["embedding"])) for d in data]
        except (ValueError, KeyError, TypeError) as exc:
            raise GatewayError(f"embeddings answer not understood: {exc}",
                               where=f"gateway {self.gateway.name}") from exc  # fmt: skip
        if len(vectors) != len(texts):
            raise GatewayError(f"{len(vectors)} embeddings for {len(texts)} inputs",
                               where=f"gateway {self.gateway.name}")  # fmt: skip
        return vectors

    def semantic_entry(self, prompt: str, response_id: str) -> str | None:
        """The Redis key of the semantic cache's entry for ``prompt`` whose stored answer has
        ``response_id`` (RedisVL hashes under the index's name), or None."""
        if self.cache is None:
            return None
        match = f"{self.gateway.semantic_index}:*"
        try:
            for key in self.cache.scan_iter(match=match, count=1000):
                stored, answer = (_text(v) for v in self.cache.hmget(key, ["prompt", "response"]))
                if stored == prompt and answer is not None and response_id in answer:
                    return _text(key)
        except redis.RedisError as exc:
            raise EngineUnavailableError(f"gateway {self.gateway.name} cache: {exc}") from exc
        return None

    def delete_entries(self, keys: Sequence[str]) -> None:
        """Delete entries from the Redis the gateway caches in (a semantic cache's entries
        have no key of LiteLLM's that its ``/cache/delete`` could name)."""
        if keys and self.cache is not None:
            try:
                self.cache.delete(*keys)
            except redis.RedisError as exc:
                raise EngineUnavailableError(f"gateway {self.gateway.name} cache: {exc}") from exc

    def stored_ttl_s(self, key: str) -> int | None:
        """Seconds the entry ``key`` has left in the Redis the gateway caches in (-1: no
        expiry; None: not there). LiteLLM also keeps entries in its process's memory, and
        answers from there first: only its Redis serves the gateway's other replicas and
        outlives a restart, so that is where a warmed entry must be."""
        if self.cache is None:
            raise BadInputError("no cache_url configured", where=f"gateways.{self.gateway.name}")
        try:
            left = int(self.cache.pttl(key))
        except redis.RedisError as exc:
            raise EngineUnavailableError(f"gateway {self.gateway.name} cache: {exc}") from exc
        return None if left == -2 else (-1 if left == -1 else left // 1000)

    def delete(self, keys: Sequence[str]) -> None:
        """Delete cache entries by the keys the gateway named (its ``/cache/delete``)."""
        if keys:
            self._post("/cache/delete", {"keys": list(keys)}, {})

    def _post(self, route: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        where = f"gateway {self.gateway.name} {route}"
        self.requests += 1
        try:
            response = self.http.post(route, json=body, headers=headers)
        except httpx.TransportError as exc:
            raise EngineUnavailableError(f"{where}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500 or response.status_code == 429:
            raise EngineUnavailableError(f"{where}: HTTP {response.status_code}")
        if response.status_code >= 400:
            raise GatewayError(response.text[:200], where=where)
        return response


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _answer_id(response: httpx.Response) -> str | None:
    try:
        value = response.json()
    except ValueError:
        return None
    answer = value.get("id") if isinstance(value, dict) else None
    return str(answer) if answer else None


class GatewayLog:
    """The gateway's request log as prewarm's callback writes it (the ``litellm`` sources)."""

    def __init__(self, files: Iterable[Path]) -> None:
        self.files = list(files)

    def cache_hits(self, request_ids: Iterable[str], tail_bytes: int = 4 << 20) -> dict[str, bool]:
        """``cache_hit`` of each of ``request_ids`` found in the last ``tail_bytes`` of the log."""
        wanted, found = set(request_ids), {}
        for path in self.files:
            for line in _tail_lines(path, tail_bytes):
                obj = _line_object(line)
                if obj is not None and obj.get("request_id") in wanted:
                    found[str(obj["request_id"])] = bool(obj.get("cache_hit"))
        return found


def _tail_lines(path: Path, tail_bytes: int) -> list[str]:
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - tail_bytes))
            data = handle.read()
    except OSError:  # rotated away between listing and reading: the next poll sees the new one
        return []
    return data.decode("utf-8", errors="replace").splitlines()


def _line_object(line: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and obj.get("log") == LOG_TAG else None


def wait_for_hits(
    log: GatewayLog, request_ids: Sequence[str], wait_s: float = 5.0, poll_s: float = 0.1
) -> dict[str, bool]:
    """Poll the log until every request id has its line (the callback writes after the
    answer) or ``wait_s`` passes; the ids found and their ``cache_hit``."""
    deadline = time.monotonic() + wait_s
    while True:
        found = log.cache_hits(request_ids)
        if len(found) == len(set(request_ids)) or time.monotonic() >= deadline:
            return found
        time.sleep(poll_s)
