"""After a drift, plans weight the newest windows: a prefix of the new workload outranks one of
the old at once, in the frequency estimate and in the counts a forecaster predicts from."""

from __future__ import annotations

import pandas as pd

from pipeline.planner.recency import OLDER_WINDOW_WEIGHT, weigh_counts, weigh_windows
from pipeline.records import records_frame
from pipeline.shared_prefixes import detect_prefixes, prefix_items

OLD = "You are the code review assistant of the payments team; show code in fences. " * 8
NEW = "You are the paralegal of the tenancy team; cite the statute you rely on. " * 8
WINDOW_S = 60


def _records() -> pd.DataFrame:
    """Eight windows of the old head (4 requests each), then one of the new head (4)."""
    start = pd.Timestamp("2027-01-15T08:00:00Z")
    rows = [{"ts": start + pd.Timedelta(seconds=WINDOW_S * w + i), "model": "m",
             "prompt": (NEW if w == 8 else OLD) + f"question {w}-{i}?"}
            for w in range(9) for i in range(4)]  # fmt: skip
    return records_frame(rows)


def _hits(newest_from: int | None) -> dict[str, float]:
    records = _records()
    found = detect_prefixes(records, window_s=WINDOW_S, min_tokens=17)
    first = int(records["ts"].min().timestamp() // WINDOW_S)
    span = (first, first + 8)
    items = prefix_items(found, None, WINDOW_S, span, newest_from)
    heads = {OLD[:40]: "old", NEW[:40]: "new"}
    return {heads[i.text[:40]]: i.predicted_hits for i in items if i.text[:40] in heads}


def test_the_new_workloads_prefix_outranks_the_old_once_the_newest_windows_weigh_more():
    plain = _hits(None)
    assert plain["old"] > plain["new"]  # the history's rate holds the old head up
    since = int(_records()["ts"].max().timestamp() // WINDOW_S)
    weighted = _hits(since)
    assert weighted["new"] > weighted["old"]
    assert weighted["new"] == plain["new"]  # the newest window counts in full


def test_windows_and_counts_before_the_change_are_scaled():
    assert weigh_windows({1: 10, 2: 10, 3: 4}, 3) == {1: 1.0, 2: 1.0, 3: 4.0}
    assert weigh_windows({1: 10}, None) == {1: 10}
    starts = pd.to_datetime([0, 60, 120], unit="s", utc=True)
    counts = pd.DataFrame({"item_kind": "prefix", "item_key": "k", "window_start": starts,
                           "requests": [10, 10, 4]})  # fmt: skip
    weighted = weigh_counts(counts, 120.0)
    assert weighted["requests"].tolist() == [10 * OLDER_WINDOW_WEIGHT] * 2 + [4.0]
    assert weigh_counts(counts, None) is counts
