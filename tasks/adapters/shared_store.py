"""The shared store: every read and write of shared state (observations, fitted models, KV-event
counts, topic mixes) goes through one :class:`SharedStore`, behind ``data_dir``'s URL.

``data_dir`` is a folder (``/var/lib/prewarm``, as before) or any URL fsspec knows:
``s3://bucket/prefix`` (s3fs; endpoint and keys from the standard ``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``), ``gs://``, ``az://``,
``memory://`` for tests. Objects are named by keys relative to it
(``observations/<engine>/counts.parquet``).

A write is whole or absent: a folder's file is written beside its place and renamed into it
(``os.replace``); an object store's PUT is atomic. Nothing here locks: a writer that must be
alone holds a Redis lock (the loop's per-engine observations lock, the model lock), since file
locks and modification times do not cross hosts. Each operation is counted
(:attr:`SharedStore.counts`: requests and bytes per operation), so a benchmark and ``status``
can say what a tick costs. An object store that does not answer is a
:class:`SharedStoreUnavailable` (transient: the caller keeps what it read and retries).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import fsspec
import pandas as pd
from fsspec.implementations.local import LocalFileSystem

from pipeline.errors import BadInputError, TransientError
from pipeline.tables import read_parquet_file

#: seconds to connect to / read from an object store before a request counts as failed: a
#: store that is down must fail a tick in seconds, not hang it for botocore's 60 s default
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 20.0


class SharedStoreUnavailable(TransientError):
    """The shared store did not answer (network, endpoint down, 5xx): retry later."""

    def __init__(self, message: str, *, where: str) -> None:
        self.where = where
        super().__init__(f"{where}: {message}")


@dataclass
class RequestCounts:
    """Requests and bytes per operation since the store was opened (or :meth:`reset`)."""

    requests: Counter[str] = field(default_factory=Counter)
    bytes_read: int = 0
    bytes_written: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, op: str, read: int = 0, written: int = 0) -> None:
        with self.lock:
            self.requests[op] += 1
            self.bytes_read += read
            self.bytes_written += written

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "requests": dict(self.requests),
                "total": sum(self.requests.values()),
                "bytes_read": self.bytes_read,
                "bytes_written": self.bytes_written,
            }

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()
            self.bytes_read = self.bytes_written = 0


def counts_since(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What was counted between two snapshots of one store's counts (a tick's requests by
    kind, and its bytes)."""
    kinds = {k: n - before["requests"].get(k, 0) for k, n in after["requests"].items()}
    return {"requests": {k: n for k, n in kinds.items() if n}, "total": after["total"] -
            before["total"], "bytes_read": after["bytes_read"] - before["bytes_read"],
            "bytes_written": after["bytes_written"] - before["bytes_written"]}  # fmt: skip


def storage_options(protocol: str) -> dict[str, Any]:
    """Options for the filesystem of ``protocol``: short timeouts and few retries for S3."""
    if protocol not in ("s3", "s3a"):
        return {}
    return {
        "config_kwargs": {
            "connect_timeout": CONNECT_TIMEOUT_S,
            "read_timeout": READ_TIMEOUT_S,
            "retries": {"max_attempts": 2, "mode": "standard"},
        },
        "use_listings_cache": False,
        "skip_instance_cache": True,
    }


class SharedStore:
    """Shared state under one URL; see the module docstring."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/") or url
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        self.fs, self.root = fsspec.core.url_to_fs(url, **storage_options(protocol))
        self.local = isinstance(self.fs, LocalFileSystem)
        if hasattr(self.fs, "retries"):
            # s3fs retries a failed call 5 times with backoff by itself; botocore's 2 attempts
            # are enough, the caller retries the tick
            self.fs.retries = 1
        self.counts = RequestCounts()

    # --- naming -------------------------------------------------------------------------------

    def path(self, key: str) -> str:
        """The filesystem's path of ``key``."""
        return f"{self.root.rstrip('/')}/{key}" if key else self.root

    def where(self, key: str) -> str:
        """``key`` as a URL (errors and status name it so)."""
        return f"{self.url}/{key}"

    # --- reads --------------------------------------------------------------------------------

    def read_bytes(self, key: str) -> bytes | None:
        """The object's bytes, or None when there is none."""
        try:
            data = self._call("get", key, lambda: self.fs.cat_file(self.path(key)))
        except FileNotFoundError:
            self.counts.add("get")  # a request that found nothing is a request
            return None
        self.counts.add("get", read=len(data))
        return bytes(data)

    def read_json(self, key: str) -> Any:
        """The object as JSON, or None when there is none."""
        data = self.read_bytes(key)
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError as exc:
            raise BadInputError(f"not JSON ({exc})", where=self.where(key)) from exc

    def read_text(self, key: str) -> str | None:
        data = self.read_bytes(key)
        return None if data is None else data.decode("utf-8")

    def read_parquet(self, key: str, what: str) -> pd.DataFrame | None:
        """The Parquet object as a frame, or None when there is none (a folder's file is read
        in place, not copied)."""
        if self.local:
            try:
                frame = read_parquet_file(Path(self.path(key)), what)
            except FileNotFoundError:
                self.counts.add("get")
                return None
            self.counts.add("get", read=os.path.getsize(self.path(key)))
            return frame
        data = self.read_bytes(key)
        if data is None:
            return None
        try:
            return pd.read_parquet(io.BytesIO(data))
        except (OSError, ValueError) as exc:
            raise BadInputError(f"cannot read {what} ({exc})", where=self.where(key)) from exc

    def exists(self, key: str) -> bool:
        found = self._call("head", key, lambda: self.fs.exists(self.path(key)))
        self.counts.add("head")
        return bool(found)

    def names(self, prefix: str) -> list[str]:
        """Names (not keys) of what is directly under ``prefix`` (empty: nothing)."""
        try:
            entries = self._call(
                "list", prefix, lambda: self.fs.ls(self.path(prefix), detail=False)
            )
        except FileNotFoundError:
            entries = []
        self.counts.add("list")
        return sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries})

    def walk(self, prefix: str) -> list[str]:
        """Every key under ``prefix`` (recursively)."""
        base = self.path(prefix).rstrip("/")
        try:
            found = self._call("list", prefix, lambda: self.fs.find(base))
        except FileNotFoundError:
            found = []
        self.counts.add("list")
        head = f"{prefix.rstrip('/')}/" if prefix else ""
        return sorted(head + str(p)[len(base) + 1 :] for p in found)

    # --- writes -------------------------------------------------------------------------------

    def write_bytes(self, key: str, data: bytes) -> None:
        """Write the object whole (a reader sees the old one or the new one, never half)."""
        if self.local:
            path = Path(self.path(key))
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            temp.write_bytes(data)
            os.replace(temp, path)
        else:
            self._call("put", key, lambda: self.fs.pipe_file(self.path(key), data))
        self.counts.add("put", written=len(data))

    def create_bytes(self, key: str, data: bytes) -> None:
        """Write the object only if there is none (:class:`FileExistsError` otherwise): a
        conditional put (``If-None-Match: *``) on a bucket, an exclusive create in a folder."""
        if self.local:
            path = Path(self.path(key))
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("xb") as handle:
                handle.write(data)
        else:
            self._call("put", key, lambda: self.fs.pipe_file(self.path(key), data, mode="create"))
        self.counts.add("put", written=len(data))

    def write_json(self, key: str, value: Any) -> None:
        self.write_bytes(key, json.dumps(value, default=str).encode())

    def write_parquet(self, key: str, frame: pd.DataFrame) -> None:
        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False)
        self.write_bytes(key, buffer.getvalue())

    def delete(self, key: str) -> None:
        """Remove the object (nothing when there is none)."""
        with contextlib.suppress(FileNotFoundError):
            self._call("delete", key, lambda: self.fs.rm_file(self.path(key)))
        self.counts.add("delete")

    def check(self, create: bool = False) -> dict[str, Any]:
        """Write, read back and remove a probe object (``create``: make the bucket or folder
        first); what it took. Raises :class:`SharedStoreUnavailable` when the store does not
        answer, :class:`BadInputError` when it answers wrongly."""
        if create:
            root = self.root.split("/", 1)[0] if not self.local else self.root
            self._call("mkdir", "", lambda: self.fs.makedirs(root, exist_ok=True))
        probe = f".prewarm-check-{os.getpid()}"
        self.write_bytes(probe, b"ok")
        if self.read_bytes(probe) != b"ok":
            raise BadInputError("a probe object did not read back", where=self.where(probe))
        self.delete(probe)
        return {"url": self.url, "ok": True, **self.counts.snapshot()}

    # --- errors -------------------------------------------------------------------------------

    def _call(self, op: str, key: str, call: Any) -> Any:
        try:
            return call()
        except (FileNotFoundError, FileExistsError):
            raise
        except (OSError, TimeoutError) as exc:
            if self.local:
                raise
            self.counts.add(f"{op}_failed")
            raise SharedStoreUnavailable(f"{op} failed ({exc})", where=self.where(key)) from exc
        except Exception as exc:
            # botocore and aiohttp raise their own trees (EndpointConnectionError,
            # ClientConnectorError), not OSError: any of them is the store not answering
            if self.local or not _is_transport_error(exc):
                raise
            self.counts.add(f"{op}_failed")
            raise SharedStoreUnavailable(f"{op} failed ({exc})", where=self.where(key)) from exc


def _is_transport_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from the object store's client library (botocore, aiohttp)."""
    module = type(exc).__module__ or ""
    return module.split(".", 1)[0] in ("botocore", "aiobotocore", "aiohttp", "s3fs", "urllib3")


@lru_cache(maxsize=16)
def _opened(url: str) -> SharedStore:
    # One store (and one client connection pool) per process and URL, opened on first use.
    return SharedStore(url)


def shared_store(data_dir: str | Path | SharedStore) -> SharedStore:
    """The store at ``data_dir`` (a folder or a URL), opened once per process."""
    if isinstance(data_dir, SharedStore):
        return data_dir
    text = str(data_dir)
    return _opened(text if "://" in text else str(Path(text).absolute()))


def forget_stores() -> None:
    """Close every opened store (tests that restart an endpoint)."""
    _opened.cache_clear()
