"""Checks of command-line values, run by click while it parses, before a command does any work.

Each returns the value or raises :class:`typer.BadParameter`, which the CLI prints as one usage
line naming the option (exit 2).
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Callable, Sequence

import typer

#: What ``prewarm plan --forecast`` accepts.
FORECASTS = ("auto", "model", "frequency")


def window(value: str) -> str:
    """A fixed window length as pandas reads it (``10min``, ``1h``, ``30s``)."""
    import pandas as pd

    try:
        length = pd.Timedelta(value)
    except (ValueError, TypeError) as exc:
        raise typer.BadParameter(f"{value!r} is not a duration such as 5min, 1h or 30s") from exc
    if length <= pd.Timedelta(0):
        raise typer.BadParameter(f"{value!r} must be longer than zero")
    return value


def timezone(value: str) -> str:
    """An IANA time zone name (``UTC``, ``Europe/Berlin``)."""
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise typer.BadParameter(f"{value!r} is not a time zone name such as UTC") from exc
    return value


def one_of(choices: Sequence[str]) -> Callable[[str | None], str | None]:
    """A check that the value (when given) is one of ``choices``."""

    def check(value: str | None) -> str | None:
        if value is not None and value not in choices:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(choices)}")
        return value

    return check
