"""Where the KV-event source keeps its state: Redis for what other processes ask, data_dir for
the rest.

Redis (prewarm's store), per engine::

    pw:kv:<engine>:held     SET of content keys of the blocks the replica holds now
                            (:func:`pipeline.kv_holdings.content_key`), for verification
    pw:kv:<engine>:status   HASH: stream counters, last sequence, block size, updated_at
    pw:kv:<engine>:alive    heartbeat of the subscriber (expires when it stops)

``data_dir``, per engine::

    kv/<engine>/holdings.msgpack   what the replica holds and knew, with the stream cursor
                                   (replaced atomically; a restarted subscriber resumes from it)
    kv/<engine>/counts.parquet     item × window counts of closed windows (``KV_COUNT_DTYPES``)
"""

from __future__ import annotations

import os
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


def engine_dir(data_dir: Path, engine: str) -> Path:
    """``<data_dir>/kv/<engine>``."""
    return data_dir / "kv" / engine


def save_holdings(data_dir: Path, holdings: ReplicaHoldings, cursor: Cursor | None) -> Path:
    """Write the snapshot atomically (a reader never sees half of one)."""
    path = engine_dir(data_dir, holdings.replica) / "holdings.msgpack"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(holdings_to_bytes(holdings, (cursor.seq, cursor.digest) if cursor else None))
    os.replace(tmp, path)
    return path


def load_holdings(data_dir: Path, engine: str) -> tuple[ReplicaHoldings, Cursor | None] | None:
    """The last snapshot of ``engine`` and its cursor, or None when there is none."""
    path = engine_dir(data_dir, engine) / "holdings.msgpack"
    if not path.exists():
        return None
    holdings, cursor = holdings_from_bytes(path.read_bytes(), where=str(path))
    return holdings, Cursor(*cursor) if cursor else None


def append_counts(data_dir: Path, engine: str, counts: pd.DataFrame) -> Path | None:
    """Add closed windows' counts to ``counts.parquet`` (rows of a window already there are
    summed, so a window written in two parts counts once)."""
    if counts.empty:
        return None
    path = engine_dir(data_dir, engine) / "counts.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        counts = pd.concat([pd.read_parquet(path), counts], ignore_index=True)
    keys = ["item_kind", "item_key", "window_start"]
    merged = counts.groupby(keys, as_index=False, observed=True).sum(numeric_only=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    merged.astype(counts.dtypes.to_dict()).to_parquet(tmp, index=False)
    os.replace(tmp, path)
    return path


def counts_after(
    data_dir: Path, engine: str, after: float | None
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


def read_counts(data_dir: Path, engine: str) -> pd.DataFrame | None:
    """The engine's KV-event counts so far, or None when none were written."""
    path = engine_dir(data_dir, engine) / "counts.parquet"
    return pd.read_parquet(path) if path.exists() else None
