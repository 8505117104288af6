"""The template serving store: per repository, the version of each template that is serving,
the re-warm records (one per sha) and request counts per template (hotness, per source)."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import redis

from pipeline.template_diff import RewarmSet, version_tag
from pipeline.templates import Template
from tasks.adapters import redis_keys
from tasks.adapters.template_repos import sha_key

_SERVING = redis_keys.TEMPLATE_SERVING
TXN_KEY = redis_keys.TEMPLATE_TXN
_HOTNESS = redis_keys.TEMPLATE_HOTNESS
_HOTNESS_SOURCES = redis_keys.TEMPLATE_HOTNESS_SOURCES
#: The hotness source of counts from an ingest output (not one engine's loop).
INGEST_SOURCE = "ingest"
_TXN_TTL_S = 7 * 24 * 3600


def _serving_value(template: Template) -> str:
    return json.dumps(
        {
            "version": template.version,
            "tag": version_tag(template),
            "path": template.path,
            "kind": template.kind,
            "static_prefix": template.static_prefix,
        }
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def serving(store: redis.Redis, repo: str) -> dict[str, dict[str, Any]]:
    """Template id → the serving version's record, for one repository."""
    raw = store.hgetall(_SERVING.format(repo=repo))
    return {_text(key): json.loads(value) for key, value in raw.items()}


def hotness(store: redis.Redis, repo: str, engine: str | None = None) -> dict[str, int]:
    """Requests per template id seen in traffic: ``engine``'s own counts when it has any (its
    loop wrote them), else the sum over every source (engines sharing the repository, ingests)."""
    if engine is not None and (own := _hotness_of(store, repo, engine)):
        return own
    total: Counter[str] = Counter()
    for source in sorted(_text(s) for s in store.smembers(_HOTNESS_SOURCES.format(repo=repo))):
        total.update(_hotness_of(store, repo, source))
    return dict(total)


def _hotness_of(store: redis.Redis, repo: str, source: str) -> dict[str, int]:
    raw = store.hgetall(_HOTNESS.format(repo=repo, source=source))
    return {_text(key): int(value) for key, value in raw.items()}


def store_hotness(
    store: redis.Redis, repo: str, counts: dict[str, int], source: str = INGEST_SOURCE
) -> None:
    """Replace ``source``'s hotness counts of ``repo`` (other sources' counts stay)."""
    key = _HOTNESS.format(repo=repo, source=source)
    with store.pipeline(transaction=True) as pipe:
        pipe.delete(key)
        if counts:
            pipe.hset(key, mapping=dict(counts.items()))
        pipe.sadd(_HOTNESS_SOURCES.format(repo=repo), source)
        pipe.execute()


def transaction(store: redis.Redis, repo: str, sha: str) -> dict[str, Any] | None:
    """The re-warm record for ``sha`` in ``repo``, or None."""
    raw = store.get(TXN_KEY.format(repo=repo, sha=sha))
    return json.loads(raw) if raw else None


def record_transaction(
    store: redis.Redis, key: str, record: dict[str, Any], **changes: Any
) -> None:
    record.update(changes, updated=time.time())
    store.set(key, json.dumps(record), ex=_TXN_TTL_S)


def commit_serving(
    store: redis.Redis, repo: str, sha: str, rewarm: RewarmSet, txn_key: str
) -> None:
    warm_ids = {t.template_id for t in rewarm.warm}
    with store.pipeline(transaction=True) as pipe:
        for template in rewarm.warm:
            pipe.hset(_SERVING.format(repo=repo), template.template_id, _serving_value(template))
        for template in rewarm.retire:
            if template.template_id not in warm_ids:
                pipe.hdel(_SERVING.format(repo=repo), template.template_id)
        pipe.set(sha_key(repo), sha)
        pipe.execute()
