"""Every input format in one registry; each format is one module of this package.

A module here defines ``FORMAT`` (a :class:`LogFormat` or :class:`TraceFormat`): its
detector, where a record may start, its parser, how its timestamps become UTC and which
``source`` its records carry. Modules are found by listing this package, so adding a format
is adding its module (and its tests).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from pipeline.errors import BadInputError
from pipeline.ingest.formats.base import (
    ChunkParser,
    FileFacts,
    InputFormat,
    LogFormat,
    Piece,
    Registry,
    TraceFormat,
)

__all__ = [
    "ChunkParser",
    "FileFacts",
    "InputFormat",
    "LogFormat",
    "Piece",
    "TraceFormat",
    "all_formats",
    "get",
    "names",
    "of_source",
]


@functools.cache
def _registry() -> Registry:
    registry = Registry()
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base":
            registry.add(importlib.import_module(f"{__name__}.{module.name}").FORMAT)
    return registry


def all_formats() -> list[InputFormat]:
    """Every format, in detection order."""
    return list(_registry().formats.values())


def of_source(source: str | None) -> list[InputFormat]:
    """The formats whose records carry ``source`` (every format for ``None``), in detection
    order; a :class:`BadInputError` naming the known sources when none does."""
    found = [f for f in all_formats() if source is None or f.source == source]
    if not found:
        known = sorted({f.source for f in all_formats()})
        raise BadInputError(f"unknown source {source!r}; one of {known}", where="source")
    return found


def names() -> tuple[str, ...]:
    """Every format's name, in detection order."""
    return tuple(_registry().formats)


def get(name: str) -> InputFormat:
    """The format called ``name``; a :class:`BadInputError` naming the known ones otherwise."""
    try:
        return _registry().formats[name]
    except KeyError:
        raise BadInputError(f"unknown format {name!r}; one of {names()}", where="format") from None
