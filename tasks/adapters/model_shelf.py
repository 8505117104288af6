"""Fitted models in the shared store, used through a folder for the length of one step.

:mod:`models.persistence` saves and loads versions in a folder (``<root>/<name>/vNNNN/…`` and a
``current`` pointer). When ``data_dir`` is a folder, that folder is the store's own. When it is
a bucket, :func:`checked_out` gives a temporary folder under the host's own ``host_dir`` with
each model's ``current`` pointer and current version (a version is immutable once published,
so its files are kept in memory by the process and fetched once), and on leaving publishes what
the step saved: each new version's files, then the pointer. Two hosts that save a version of
one model at once never interleave one version: a version is claimed by a conditional put of
its ``.claim`` marker (``If-None-Match: *``), and the loser takes the next number. The folder
is removed on leaving, so nothing of shared state stays on the host.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tasks.adapters.observations import models_key
from tasks.adapters.shared_store import SharedStore, shared_store

_VERSION = re.compile(r"^v(\d{4,})$")
#: a process's copies of published versions: (store URL, version key) → {file name: bytes}
_VERSIONS: dict[tuple[str, str], dict[str, bytes]] = {}


@contextmanager
def checked_out(data_dir: str | Path, engine: str | None, host_dir: Path) -> Iterator[Path]:
    """A folder holding the models of ``engine`` (None: the shared ones) for this step; what
    the step saves there is published when it ends without an error."""
    store = shared_store(data_dir)
    if store.local:
        yield Path(store.path(models_key(engine)))
        return
    prefix = models_key(engine)
    host_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".models-", dir=host_dir) as folder:
        root = Path(folder)
        fetched = fetch(store, prefix, root)
        yield root
        publish(store, prefix, root, fetched)


def current_pointer(data_dir: str | Path, engine: str | None, name: str) -> str | None:
    """The current version of a saved model (None: none saved), from the store."""
    text = shared_store(data_dir).read_text(f"{models_key(engine)}/{name}/current")
    return None if text is None else text.strip()


def fetch(store: SharedStore, prefix: str, root: Path) -> dict[str, str]:
    """Write each model's pointer and current version under ``root``; the pointers read."""
    pointers = {}
    for name in store.names(prefix):
        pointer = store.read_text(f"{prefix}/{name}/current")
        if pointer is None:
            continue
        pointer = pointer.strip()
        home = root / name
        (home / pointer).mkdir(parents=True, exist_ok=True)
        for part, data in _version_files(store, f"{prefix}/{name}/{pointer}").items():
            (home / pointer / part).write_bytes(data)
        (home / "current").write_text(pointer, encoding="utf-8")
        pointers[name] = pointer
    return pointers


def _version_files(store: SharedStore, key: str) -> dict[str, bytes]:
    cached = _VERSIONS.get((store.url, key))
    if cached is not None:
        return cached
    files = {}
    for part in store.names(key):
        if part.startswith("."):
            continue
        data = store.read_bytes(f"{key}/{part}")
        if data is not None:
            files[part] = data
    _VERSIONS[(store.url, key)] = files
    return files


def publish(store: SharedStore, prefix: str, root: Path, fetched: dict[str, str]) -> None:
    """Upload the versions saved under ``root`` since :func:`fetch`, then their pointers."""
    for home in sorted(p for p in root.iterdir() if p.is_dir()):
        pointer_file = home / "current"
        if not pointer_file.is_file():
            continue
        pointer = pointer_file.read_text(encoding="utf-8").strip()
        if fetched.get(home.name) == pointer:
            continue
        published = _publish_version(store, f"{prefix}/{home.name}", home / pointer)
        store.write_bytes(f"{prefix}/{home.name}/current", published.encode())


def _publish_version(store: SharedStore, key: str, folder: Path) -> str:
    """Claim a version number for ``folder`` (its own, else the next free one), upload its
    files and return the number it got."""
    name = folder.name
    while not _claim(store, f"{key}/{name}/.claim"):
        taken = [int(m.group(1)) for m in map(_VERSION.match, store.names(key)) if m]
        name = f"v{max(taken, default=0) + 1:04d}"
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    for part, data in sorted(files.items(), key=lambda kv: kv[0] == "metadata.json"):
        store.write_bytes(f"{key}/{name}/{part}", data)  # metadata last: a whole version
    _VERSIONS[(store.url, f"{key}/{name}")] = files
    return name


def _claim(store: SharedStore, key: str) -> bool:
    """Create ``key`` only if it is not there (False: another writer has it)."""
    try:
        store.create_bytes(key, b"")
    except FileExistsError:
        return False
    return True
