"""Reading an engine's ``[[sources]]``: what is new since the last read, state in the store Redis.

Each source (a file, a folder or a glob) is read by the reader registered for its ``kind``;
the log and trace kinds go through :func:`pipeline.ingest.ingest_paths` with an
:class:`~pipeline.ingest.IngestState`, so only appended bytes are read, a half-written last line
is left for the next read, and a rotated (or rotated and compressed) file continues where it
stopped. The state of every source lives in the store Redis (one hash per engine), so any
worker on any host continues where another stopped.

A source that matches no file or cannot be read is reported (its status says why) and the
others are still read; it never stops the loop.
"""

from __future__ import annotations

import glob
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
import redis

from pipeline.errors import PrewarmError
from pipeline.ingest import IngestOptions, IngestResult, IngestState, ingest_paths
from pipeline.ingest.state import FileState
from pipeline.own_requests import without_own_requests
from pipeline.records import records_frame
from tasks.adapters import fleet_state, redis_keys
from tasks.settings import EngineSettings, Settings, SourceSettings

log = logging.getLogger(__name__)

#: A reader reads what is new in one source, resuming ``state`` (which it advances).
Reader = Callable[[list[Path], SourceSettings, EngineSettings, Settings, IngestState], IngestResult]


@dataclass(frozen=True)
class SourceRead:
    """What one read of one source found."""

    source: str
    kind: str
    path: str
    files: int = 0
    records: int = 0
    rejected: int = 0
    #: prewarm's own requests found in the source (warm-ups, probes): left out, not demand
    own: int = 0
    #: bytes read so far per file (the ingest state's offsets)
    offsets: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    ts: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def source_id(source: SourceSettings) -> str:
    """A source's stable name: its kind and path."""
    return f"{source.kind}:{source.path}"


def source_files(source: SourceSettings) -> list[Path]:
    """The files a source names now: the file, every file under the folder, or the glob's."""
    path = Path(source.path)
    if path.is_dir():
        return [p for p in sorted(path.rglob("*")) if p.is_file() and not p.name.startswith(".")]
    if any(char in source.path for char in "*?["):
        return [
            Path(p) for p in sorted(glob.glob(source.path, recursive=True)) if Path(p).is_file()
        ]
    return [path] if path.is_file() else []


def gateway_log_files(settings: Settings, engine: str) -> list[Path]:
    """The files of ``engine``'s gateway request logs (its ``litellm`` sources) now."""
    return [path for source in settings.sources_of(engine) if source.kind == "litellm"
            for path in source_files(source)]  # fmt: skip


def ingest_reader(fmt: str | None, log_source: str | None = None) -> Reader:
    """A reader through prewarm's ingest, with the format fixed (or detected per file, among
    the formats of ``log_source`` when given: an engine's forms of its log)."""

    def read(
        files: list[Path],
        source: SourceSettings,
        engine: EngineSettings,
        settings: Settings,
        state: IngestState,
    ) -> IngestResult:
        options = IngestOptions(
            format=fmt, source=log_source, tz=source.tz, year=source.year,
            model=engine.model, window=f"{settings.schedule.window_s}s",
        )  # fmt: skip
        return ingest_paths(files, options, state)

    return read


#: kind → reader; a new kind of source registers its reader here (``register_reader``).
READERS: dict[str, Reader] = {
    "vllm-log": ingest_reader(None, "vllm"),  # its text or OTel JSON form, per file
    "tgi-log": ingest_reader(None),
    "jsonl": ingest_reader("prewarm-jsonl"),
    "trace": ingest_reader(None),
    "litellm": ingest_reader("litellm-jsonl"),  # prewarm's callback in LiteLLM's proxy
}


def register_reader(kind: str, reader: Reader) -> None:
    """Read sources of ``kind`` with ``reader`` (also add ``kind`` to settings' kinds)."""
    READERS[kind] = reader


class SourceStates:
    """Reading state and last status of an engine's sources, in the store Redis."""

    def __init__(self, store: redis.Redis) -> None:
        self.r = store

    def load(self, engine: str, source: str) -> IngestState:
        raw = self.r.hget(redis_keys.SOURCE_STATE.format(engine=engine), source)
        if not raw:
            return IngestState()
        files = json.loads(raw)
        return IngestState({path: FileState(**data) for path, data in files.items()})

    def save(self, engine: str, source: str, state: IngestState) -> None:
        body = json.dumps({path: asdict(s) for path, s in state.files.items()})
        self.r.hset(redis_keys.SOURCE_STATE.format(engine=engine), source, body)

    def record(self, engine: str, read: SourceRead) -> None:
        body = json.dumps(read.to_dict())
        self.r.hset(redis_keys.SOURCE_STATUS.format(engine=engine), read.source, body)

    def statuses(self, engine: str) -> dict[str, dict[str, Any]]:
        raw = self.r.hgetall(redis_keys.SOURCE_STATUS.format(engine=engine))
        return {_text(k): json.loads(v) for k, v in raw.items()}

    def forget_others(self, engine: str, keep: set[str]) -> None:
        """Drop the state of sources no longer configured for ``engine``."""
        for key in (redis_keys.SOURCE_STATE, redis_keys.SOURCE_STATUS):
            name = key.format(engine=engine)
            stale = [f for f in map(_text, self.r.hkeys(name)) if f not in keep]
            if stale:
                self.r.hdel(name, *stale)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass
class NewData:
    """What the sources of one engine held that was not read before."""

    records: pd.DataFrame
    counts: pd.DataFrame | None
    metrics: pd.DataFrame | None
    reads: list[SourceRead]


def _read_one(
    source: SourceSettings, engine: EngineSettings, settings: Settings, states: SourceStates,
    sent: frozenset[str] = frozenset(),
) -> tuple[IngestResult | None, SourceRead]:  # fmt: skip
    sid = source_id(source)
    base = SourceRead(sid, source.kind, source.path, ts=time.time())
    files = source_files(source)
    if not files:
        return None, replace(base, error="no file matches this path (vanished or not yet written)")
    state = states.load(engine.name, sid)
    try:
        result = READERS[source.kind](files, source, engine, settings, state)
    except (PrewarmError, OSError) as exc:  # vanished between listing and reading, unreadable
        log.warning("source %s of %s unreadable: %s", sid, engine.name, exc)
        return None, replace(base, files=len(files), error=str(exc))
    states.save(engine.name, sid, state)
    summary = result.summary_dict()
    records, counts, own = without_own_requests(
        result.records, result.counts, f"{settings.schedule.window_s}s", sent
    )
    result = replace(result, records=records, counts=counts)
    offsets = {path: s.offset for path, s in state.files.items()}
    read = replace(base, files=len(files), records=len(records), own=own,
                   rejected=int(summary["rejected"]), offsets=offsets)  # fmt: skip
    return result, read


def read_new(settings: Settings, store: redis.Redis, engine: EngineSettings) -> NewData:
    """Read what is new in every source of ``engine``; each source's status is recorded."""
    states = SourceStates(store)
    sources = settings.sources_of(engine.name)
    if sources:
        # a worker on a host without the engine's logs (none configured there) leaves the
        # offsets of the ingest host's sources alone: it reads none, and forgets none
        states.forget_others(engine.name, {source_id(s) for s in sources})
    results, reads = [], []
    # (a fleet replica's log also names the warm-ups sent through its router)
    sent = fleet_state.sent_ids(store) if engine.fleet is not None else frozenset()
    for source in sources:
        result, read = _read_one(source, engine, settings, states, sent)
        states.record(engine.name, read)
        reads.append(read)
        if result is not None:
            results.append(result)
    records = _concat([r.records for r in results])
    return NewData(
        records=records if records is not None else records_frame([]),
        counts=_concat([r.counts for r in results if r.counts is not None]),
        metrics=_concat([r.metrics for r in results if len(r.metrics)]),
        reads=reads,
    )


def _concat(frames: list[pd.DataFrame]) -> Any:
    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        return None
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
