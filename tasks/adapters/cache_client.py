"""The read side: serve what was warmed, so warming is actually used.

``exact`` finds a response by its versioned key (built with :func:`pipeline.keys.response_key`
from the same model, template version, sampling parameters, prompt and tenant). ``semantic``
compares a query embedding with the embeddings cached for a tenant and model and returns the
best entry above a cosine-similarity threshold — the query must be embedded by the same model
that embedded the cached prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis

from pipeline.keys import KEY_SCHEME_VERSION, decode_value, safe_part, tenant_namespace
from tasks.adapters.wal_store import as_text


@dataclass(frozen=True, slots=True)
class SemanticHit:
    """A cached embedding close enough to the query."""

    key: str
    similarity: float
    value: dict[str, Any]


class CacheClient:
    """Lookups on prewarm's store (the Redis that the response and embedding targets fill)."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client

    def exact(self, key: str) -> dict[str, Any] | None:
        """The cached value under ``key``, or None (expired, never warmed, other version)."""
        return decode_value(self.r.get(key))

    def _embedding_keys(self, tenant: str, model: str) -> list[str]:
        pattern = f"{tenant_namespace(tenant, KEY_SCHEME_VERSION)}embedding:{safe_part(model)}:*"
        return [as_text(k) for k in self.r.scan_iter(match=pattern, count=1000)]

    def semantic(
        self, query: Sequence[float], *, tenant: str, model: str, threshold: float = 0.9
    ) -> SemanticHit | None:
        """The closest cached embedding of ``tenant``/``model`` if its cosine >= ``threshold``."""
        keys = self._embedding_keys(tenant, model)
        if not keys:
            return None
        values = [decode_value(raw) for raw in self.r.mget(keys)]
        rows = [(k, v) for k, v in zip(keys, values, strict=True) if v and v.get("vector")]
        if not rows:
            return None
        matrix = np.asarray([v["vector"] for _, v in rows], dtype=np.float64)
        q = np.asarray(query, dtype=np.float64)
        norms = np.linalg.norm(matrix, axis=1) * (np.linalg.norm(q) or 1.0)
        sims = matrix @ q / np.where(norms == 0, 1.0, norms)
        best = int(np.argmax(sims))
        if sims[best] < threshold:
            return None
        key, value = rows[best]
        return SemanticHit(key, float(sims[best]), value)
