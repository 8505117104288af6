"""Topic drift: a window's topic mix against its baseline, past the history's P95."""

from __future__ import annotations

import random

from pipeline.topic_drift import TopicDriftRule, topic_divergences, topic_drift_event
from pipeline.triggers import TOPIC_DRIFT


def _mixes(windows: list[dict[str, float]]) -> list[tuple[float, dict[str, float]]]:
    return [(60.0 * w, mix) for w, mix in enumerate(windows)]


def test_topic_drift_fires_on_a_moved_mix_past_the_historys_p95_and_not_on_noise():
    rng = random.Random(3)

    def steady() -> dict[str, float]:
        counts = {"t0": 0.0, "t1": 0.0, "t2": 0.0, "unseen": 0.0}
        for _ in range(32):
            counts[rng.choices(list(counts), [0.4, 0.3, 0.25, 0.05])[0]] += 1
        return counts

    history = [steady() for _ in range(30)]
    for end in range(9, 31):  # every steady window, judged against its own history
        assert topic_drift_event("e", _mixes(history[:end])) is None
    moved = {"t0": 4.0, "t1": 3.0, "t2": 3.0, "unseen": 22.0}
    event = topic_drift_event("e", _mixes([*history, moved]))
    assert event is not None and event.kind == TOPIC_DRIFT and event.ts == 60.0 * 30
    assert event.detail["js_divergence"] > event.detail["threshold"] >= 0.1


def test_topic_drift_needs_a_history_and_enough_prompts():
    steady = {"t0": 20.0, "t1": 12.0}
    moved = {"unseen": 32.0}
    rule = TopicDriftRule()
    short = [steady] * (rule.baseline_windows + rule.min_history - 1)
    assert topic_drift_event("e", _mixes([*short, moved])) is None  # no P95 to speak of yet
    full = [steady] * (rule.baseline_windows + rule.min_history)
    assert topic_drift_event("e", _mixes([*full, moved])) is not None
    assert topic_drift_event("e", _mixes([*full, {"unseen": 8.0}])) is None  # 8 prompts
    divergences = topic_divergences(_mixes([*full, moved]), rule)
    assert divergences[: rule.baseline_windows] == [None] * rule.baseline_windows
