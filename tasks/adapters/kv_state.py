"""Where the KV-event source keeps its state: Redis for what other processes ask, the shared
store (``data_dir``, :mod:`tasks.adapters.shared_store`) for the rest.

Redis (prewarm's store), per engine::

    pw:kv:<engine>:held     SET of content keys of the blocks the replica holds now
                            (:func:`pipeline.kv_holdings.content_key`), for verification
    pw:kv:<engine>:status   HASH: stream counters, last sequence, block size, updated_at
    pw:kv:<engine>:alive    heartbeat of the subscriber (expires when it stops)

``data_dir``, per engine::

    kv/<engine>/holdings.msgpack   what the replica holds and knew, with the stream cursor
                                   (replaced whole; a restarted subscriber resumes from it)
    kv/<engine>/counts.parquet     item × window counts of closed windows (``KV_COUNT_DTYPES``)
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd
import redis

from pipeline.kv_holdings import ReplicaHoldings
from pipeline.kv_snapshot import holdings_from_bytes, holdings_to_bytes
from pipeline.windows import COUNT_DTYPES
from tasks.adapters import redis_keys
from tasks.adapters.kv_subscriber import Cursor
from tasks.adapters.shared_store import shared_store

PREFIX = redis_keys.KV


def _key(engine: str, part: str) -> str:
    return f"{PREFIX}{engine}:{part}"


class KvStateStore:
    """The Redis side of one engine's KV-event state."""

    def __init__(self, store: redis.Redis, engine: str) -> None:
        self.store, self.engine = store, engine

    def apply(self, cleared: bool, held: Iterable[str], gone: Iterable[str]) -> None:
        """Mirror held-set changes in one transaction (a reset first empties the set)."""
        key = _key(self.engine, "held")
        held, gone = list(held), list(gone)
        if not (cleared or held or gone):
            return
        with self.store.pipeline() as pipe:
            if cleared:
                pipe.delete(key)
            if gone:
                pipe.srem(key, *gone)
            if held:
                pipe.sadd(key, *held)
            pipe.execute()

    def replace(self, held: Iterable[str]) -> None:
        """Set the held set to ``held`` (after loading a snapshot)."""
        key, held = _key(self.engine, "held"), list(held)
        with self.store.pipeline() as pipe:
            pipe.delete(key)
            if held:
                pipe.sadd(key, *held)
            pipe.execute()

    def heartbeat(self, status: Mapping[str, object], ttl_s: int = 10) -> None:
        """Publish the subscriber's counters and mark it alive for ``ttl_s`` seconds."""
        fields = {k: str(v) for k, v in status.items() if v is not None}
        fields["updated_at"] = f"{time.time():.3f}"
        with self.store.pipeline() as pipe:
            pipe.hset(_key(self.engine, "status"), mapping=fields)  # type: ignore[arg-type]
            pipe.set(_key(self.engine, "alive"), "1", ex=ttl_s)
            pipe.execute()

    def alive(self) -> bool:
        """Whether a subscriber of this engine's events is running."""
        return bool(self.store.exists(_key(self.engine, "alive")))

    def status(self) -> dict[str, str]:
        """The last heartbeat's fields (empty when none)."""
        raw = self.store.hgetall(_key(self.engine, "status"))
        return {_text(k): _text(v) for k, v in raw.items()}

    def block_size(self) -> int | None:
        """The block size the engine's events carry, when seen."""
        value = self.store.hget(_key(self.engine, "status"), "block_size")
        return int(value) if value else None

    def held_all(self, contents: list[str]) -> bool:
        """Whether every one of ``contents`` is held now."""
        if not contents:
            return False
        return all(self.store.smismember(_key(self.engine, "held"), contents))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def engine_key(engine: str) -> str:
    """``kv/<engine>`` in the shared store."""
    return f"kv/{engine}"


def save_holdings(data_dir: str | Path, holdings: ReplicaHoldings, cursor: Cursor | None) -> str:
    """Write the snapshot whole (a reader never sees half of one); its key."""
    key = f"{engine_key(holdings.replica)}/holdings.msgpack"
    data = holdings_to_bytes(holdings, (cursor.seq, cursor.digest) if cursor else None)
    shared_store(data_dir).write_bytes(key, data)
    return key


def load_holdings(
    data_dir: str | Path, engine: str
) -> tuple[ReplicaHoldings, Cursor | None] | None:
    """The last snapshot of ``engine`` and its cursor, or None when there is none."""
    store = shared_store(data_dir)
    key = f"{engine_key(engine)}/holdings.msgpack"
    data = store.read_bytes(key)
    if data is None:
        return None
    holdings, cursor = holdings_from_bytes(data, where=store.where(key))
    return holdings, Cursor(*cursor) if cursor else None


def append_counts(data_dir: str | Path, engine: str, counts: pd.DataFrame) -> str | None:
    """Add closed windows' counts to ``counts.parquet`` (rows of a window already there are
    summed, so a window written in two parts counts once); its key."""
    if counts.empty:
        return None
    old = read_counts(data_dir, engine)
    if old is not None:
        counts = pd.concat([old, counts], ignore_index=True)
    keys = ["item_kind", "item_key", "window_start"]
    merged = counts.groupby(keys, as_index=False, observed=True).sum(numeric_only=True)
    key = f"{engine_key(engine)}/counts.parquet"
    shared_store(data_dir).write_parquet(key, merged.astype(counts.dtypes.to_dict()))
    return key


def counts_after(
    data_dir: str | Path, engine: str, after: float | None
) -> tuple[pd.DataFrame | None, float | None]:
    """The engine's KV-event counts of the windows that start after ``after`` (Unix seconds;
    None: all) as observation counts (``COUNT_DTYPES``: the uses of each held chain), and the
    start of the last of them (None: no new window)."""
    counts = read_counts(data_dir, engine)
    if counts is None or counts.empty:
        return None, None
    starts = counts["window_start"].map(lambda t: t.timestamp())
    new = counts[starts > after] if after is not None else counts
    if new.empty:
        return None, None
    last = float(new["window_start"].max().timestamp())
    return new[list(COUNT_DTYPES)].astype(COUNT_DTYPES).reset_index(drop=True), last


def read_counts(data_dir: str | Path, engine: str) -> pd.DataFrame | None:
    """The engine's KV-event counts so far, or None when none were written."""
    key = f"{engine_key(engine)}/counts.parquet"
    return shared_store(data_dir).read_parquet(key, "KV-event counts")
