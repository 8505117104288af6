"""Paths or URLs on the command line: ``prewarm ingest``, ``evaluate``, ``plan`` and ``report``
take ``s3://bucket/key`` (any fsspec URL) wherever they take a file or a folder.

An input URL is copied into a temporary folder under the host's own folder for the length of the
command (a key is one file, a prefix a folder); an output URL is written in a temporary folder
and copied up, whole, when the command ends without an error. Both go through the one store
adapter (:mod:`tasks.adapters.shared_store`); nothing stays on the host.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import typer

from pipeline.errors import BadInputError
from tasks.adapters.shared_store import SharedStore, shared_store


def is_url(location: str | Path) -> bool:
    """Whether ``location`` names an object store (``scheme://…``) rather than a local path."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


def _split(url: str) -> tuple[SharedStore, str]:
    base, _, name = url.rstrip("/").rpartition("/")
    return shared_store(base), name


def _temporary(host_dir: Path | None) -> tempfile.TemporaryDirectory[str]:
    if host_dir is not None:
        host_dir.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(prefix=".prewarm-url-", dir=host_dir)


def download(url: str, into: Path) -> Path:
    """Copy the object or prefix at ``url`` into the folder ``into``; the local copy."""
    parent, name = _split(url)
    data = parent.read_bytes(name)
    if data is not None:
        (into / name).write_bytes(data)
        return into / name
    store = shared_store(url)
    keys = store.walk("")
    if not keys:
        raise BadInputError("no such object or prefix", where=url)
    for key in keys:
        target = into / name / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(store.read_bytes(key) or b"")
    return into / name


def upload(local: Path, url: str) -> list[str]:
    """Copy the file or folder ``local`` to ``url`` (a folder: each file under its relative
    key); the keys written."""
    if local.is_file():
        parent, name = _split(url)
        parent.write_bytes(name, local.read_bytes())
        return [name]
    store = shared_store(url)
    written = []
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        key = path.relative_to(local).as_posix()
        store.write_bytes(key, path.read_bytes())
        written.append(key)
    return written


@contextmanager
def local_inputs(locations: Sequence[str], host_dir: Path | None = None) -> Iterator[list[Path]]:
    """Each location as a local path (a URL copied down for the command's length)."""
    if not any(is_url(x) for x in locations):
        yield [Path(x) for x in locations]
        return
    with _temporary(host_dir) as folder:
        out = []
        for n, location in enumerate(locations):
            if is_url(location):
                (Path(folder) / str(n)).mkdir()
                out.append(download(location, Path(folder) / str(n)))
            else:
                out.append(Path(location))
        yield out


@contextmanager
def local_output(
    location: str, host_dir: Path | None = None, folder: bool = True
) -> Iterator[Path]:
    """A local folder (``folder``) or file path to write ``location``'s output to; a URL's is
    copied up when the block ends without an error."""
    if not is_url(location):
        yield Path(location)
        return
    with ExitStack() as stack:
        temp = Path(stack.enter_context(_temporary(host_dir)))
        target = temp / "out" if folder else temp / location.rstrip("/").rsplit("/", 1)[-1]
        if folder:
            target.mkdir()
        yield target
        upload(target, location)


def check_inputs(locations: Sequence[str], hint: str = "'PATHS...'") -> None:
    """Refuse a local input that is not there, as the option parser would (a URL is checked
    when it is copied down)."""
    for location in locations:
        if not is_url(location) and not Path(location).exists():
            raise typer.BadParameter(f"Path '{location}' does not exist.", param_hint=hint)


def check_output(location: str | None, folder: bool, hint: str = "'--out'") -> None:
    """Refuse a local output of the wrong kind (a file for a folder, a folder for a file), as
    the option parser would."""
    if location is None or is_url(location):
        return
    path = Path(location)
    if folder and path.is_file():
        raise typer.BadParameter(f"Directory '{location}' is a file.", param_hint=hint)
    if not folder and path.is_dir():
        raise typer.BadParameter(f"File '{location}' is a directory.", param_hint=hint)
