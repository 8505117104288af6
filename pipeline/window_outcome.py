"""Whether a warm-up paid, for one window that just closed (pure).

For the requests of a window, per item: was the item warm when the window began (warmed by a
committed batch after the engine's last restart)? If not, why not:

- ``new``: the item was never seen before this window (no forecast could have named it);
- ``evicted``: it was warmed, but the engine restarted after that (its cache was emptied);
- ``warmed_late``: a plan named it, but it was not warm yet when the window began;
- ``cut_by_budget``: it was seen before, no plan named it, and the last plan for the engine left
  items out for its budget;
- ``never_planned``: it was seen before, no plan named it and none left anything out (the
  forecast gave it nothing, or no plan ran).

The forecast's error on the window compares what was predicted for it with what came.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MISS_CAUSES = ("never_planned", "cut_by_budget", "evicted", "warmed_late", "new")


@dataclass(frozen=True, slots=True)
class WarmState:
    """What prewarm did for one engine before a window: when each item was warmed and planned."""

    warmed_at: Mapping[str, float] = field(default_factory=dict)
    planned: frozenset[str] = frozenset()
    budget_cut: bool = False
    restarted_at: float | None = None


@dataclass(frozen=True, slots=True)
class WindowOutcome:
    """Coverage, misses by cause, forecast error and the busiest items of one window."""

    window_start: float
    window_end: float
    requests: int
    covered: int
    misses: Mapping[str, int]
    predicted: float | None
    absolute_error: float | None
    top: tuple[tuple[str, int, bool], ...] = ()

    @property
    def coverage(self) -> float | None:
        """Share of the window's requests whose item was warm when the window began."""
        return self.covered / self.requests if self.requests else None

    @property
    def relative_error(self) -> float | None:
        """Sum of |predicted - observed| over items, over the observed requests."""
        if self.absolute_error is None or not self.requests:
            return None
        return self.absolute_error / self.requests

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the history the report reads)."""
        return {
            "window_start": self.window_start,
            "window_end": self.window_end,
            "requests": self.requests,
            "covered": self.covered,
            "misses": dict(self.misses),
            "predicted": self.predicted,
            "absolute_error": self.absolute_error,
            "top": [list(row) for row in self.top],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WindowOutcome:
        """Inverse of :meth:`to_dict`."""
        return cls(
            float(data["window_start"]),
            float(data["window_end"]),
            int(data["requests"]),
            int(data["covered"]),
            {str(k): int(v) for k, v in data["misses"].items()},
            None if data.get("predicted") is None else float(data["predicted"]),
            None if data.get("absolute_error") is None else float(data["absolute_error"]),
            tuple((str(k), int(n), bool(c)) for k, n, c in data.get("top", ())),
        )


def is_warm(key: str, state: WarmState, at: float) -> bool:
    """Whether ``key`` was warmed before ``at`` and after the engine's last restart."""
    warmed = state.warmed_at.get(key)
    if warmed is None or warmed > at:
        return False
    return state.restarted_at is None or warmed >= state.restarted_at


def miss_cause(key: str, state: WarmState, seen_before: frozenset[str], at: float) -> str:
    """Why ``key`` was not warm at ``at`` (one of :data:`MISS_CAUSES`)."""
    warmed = state.warmed_at.get(key)
    if warmed is not None and warmed <= at:
        return "evicted"
    if key in state.planned or warmed is not None:
        return "warmed_late"
    if key not in seen_before:
        return "new"
    return "cut_by_budget" if state.budget_cut else "never_planned"


def forecast_error(
    observed: Mapping[str, int], predicted: Mapping[str, float]
) -> tuple[float, float]:
    """(total predicted, sum of |predicted - observed| over every item either names)."""
    keys = set(observed) | set(predicted)
    error = sum(abs(predicted.get(k, 0.0) - observed.get(k, 0)) for k in keys)
    return float(sum(predicted.values())), float(error)


def window_outcome(
    window: tuple[float, float],
    observed: Mapping[str, int],
    state: WarmState,
    seen_before: Iterable[str],
    predicted: Mapping[str, float] | None = None,
    top_n: int = 10,
) -> WindowOutcome:
    """The outcome of the window ``[start, end)`` whose requests per item are ``observed``."""
    start, end = window
    seen = frozenset(seen_before)
    misses = dict.fromkeys(MISS_CAUSES, 0)
    covered = 0
    warm: dict[str, bool] = {}
    for key, count in observed.items():
        warm[key] = is_warm(key, state, start)
        if warm[key]:
            covered += count
        else:
            misses[miss_cause(key, state, seen, start)] += count
    total, error = forecast_error(observed, predicted) if predicted is not None else (None, None)
    busiest = sorted(observed.items(), key=lambda kv: (-kv[1], kv[0]))[:top_n]
    top = tuple((key, count, warm[key]) for key, count in busiest)
    return WindowOutcome(start, end, sum(observed.values()), covered, misses, total, error, top)


def request_items(chains: Iterable[Sequence[str] | None], known: Iterable[str]) -> dict[str, int]:
    """Requests per item, one item per request: the deepest block of its prefix chain that
    prewarm planned or warmed (``known``), else the chain's head (what a plan would have had
    to name first). Requests without a chain are left out."""
    wanted = frozenset(known)
    out: dict[str, int] = {}
    for chain in chains:
        if chain is None or len(chain) == 0:
            continue
        item = next((h for h in reversed(chain) if h in wanted), chain[0])
        out[item] = out.get(item, 0) + 1
    return out
