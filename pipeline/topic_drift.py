"""Topic drift (pure): a window's topic mix against the windows before it.

A topic mix is how many of a window's sampled prompts fall in each topic
(:class:`models.topics.TopicModel`, the loop's :mod:`tasks.services.topic_drift`). The
distance is the Jensen-Shannon divergence of :mod:`pipeline.triggers`, and the threshold comes
from the history itself (:class:`TopicDriftRule`), so an engine whose traffic is always varied
is not held to the bar of one whose traffic never changes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from pipeline.triggers import TOPIC_DRIFT, TriggerEvent, js_divergence


@dataclass(frozen=True, slots=True)
class TopicDriftRule:
    """When a window's topic mix has moved: its Jensen-Shannon divergence from the pooled mix
    of the ``baseline_windows`` windows before it is over ``margin`` times the P95
    (``quantile``) of the same divergence over the history's windows, and over
    ``min_divergence`` (bits). The history must hold ``min_history`` such divergences first;
    a window of fewer than ``min_prompts`` sampled prompts is neither judged nor pooled.

    Numbers from 64 sampled prompts a window (``topics.sample_per_window``) in 4 topics and
    ``unseen`` (all-MiniLM-L6-v2, the code-to-legal workload of
    ``benchmarks/topic_workload.py``, 8 seeds): a window of steady traffic stays under 0.06
    bits; the window where half the users moved is at 0.11-0.29, the next one at 0.32-0.47.
    With 32 prompts a steady window reached 0.10 (1 in 64) and a moved one could stay at
    0.14. A steady window is over its history's P95 one time in twenty by definition, hence
    the margin, and a short history underestimates its tail, hence the floor.
    """

    baseline_windows: int = 4
    min_history: int = 4
    quantile: float = 0.95
    margin: float = 1.5
    min_divergence: float = 0.1
    min_prompts: int = 16


#: One window's topic mix: its start (Unix seconds) and sampled prompts per topic.
TopicMix = tuple[float, Mapping[str, float]]


def topic_divergences(mixes: Sequence[TopicMix], rule: TopicDriftRule) -> list[float | None]:
    """Each window's divergence from the pooled mix of the ``rule.baseline_windows`` judged
    windows before it (None: too few prompts, or too few windows before it)."""
    out: list[float | None] = []
    baseline: deque[Mapping[str, float]] = deque(maxlen=rule.baseline_windows)
    for _, mix in mixes:
        judged = sum(mix.values()) >= rule.min_prompts
        full = len(baseline) == baseline.maxlen
        out.append(js_divergence(mix, _pool(baseline)) if judged and full else None)
        if judged:
            baseline.append(mix)
    return out


def _pool(mixes: Iterable[Mapping[str, float]]) -> dict[str, float]:
    pooled: dict[str, float] = {}
    for mix in mixes:
        for topic, count in mix.items():
            pooled[topic] = pooled.get(topic, 0.0) + count
    return pooled


def topic_drift_event(
    engine: str, mixes: Sequence[TopicMix], rule: TopicDriftRule | None = None
) -> TriggerEvent | None:
    """``topic_drift`` when the newest window of ``mixes`` (oldest first) moved away from its
    baseline past the history's P95 (:class:`TopicDriftRule`); else None."""
    rule = rule or TopicDriftRule()
    divergences = topic_divergences(mixes, rule)
    if not divergences or divergences[-1] is None:
        return None
    history = [d for d in divergences[:-1] if d is not None]
    if len(history) < rule.min_history:
        return None
    p95 = float(pd.Series(history).quantile(rule.quantile))
    threshold = max(rule.min_divergence, rule.margin * p95)
    if divergences[-1] <= threshold:
        return None
    ts, mix = mixes[-1]
    detail = {
        "js_divergence": round(divergences[-1], 4), "history_p95": round(p95, 4),
        "threshold": round(threshold, 4), "history": len(history),
        "prompts": int(sum(mix.values())),
    }  # fmt: skip
    return TriggerEvent(TOPIC_DRIFT, engine, ts, detail)
