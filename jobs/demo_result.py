"""What the demo measured: each replayed request as the client saw it, and the whole result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobs.demo_pipeline import Learned


@dataclass(frozen=True)
class Served:
    """One replayed request as the client saw it."""

    template: str
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int


@dataclass
class DemoResult:
    """Everything the demo measured, for the printout and the tests."""

    cold: list[Served] = field(default_factory=list)
    warm: list[Served] = field(default_factory=list)
    learned: Learned | None = None
    report: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @staticmethod
    def first_uses(served: list[Served]) -> dict[str, Served]:
        """The first request of each template (the one a cold cache makes wait)."""
        first: dict[str, Served] = {}
        for item in served:
            first.setdefault(item.template, item)
        return first
