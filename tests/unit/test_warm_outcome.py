"""Coverage, misses by cause and forecast error of a closed window (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline.window_outcome import MISS_CAUSES, WarmState, WindowOutcome, window_outcome

WINDOW = (1000.0, 1300.0)


def test_each_cause_is_told_apart():
    state = WarmState(
        warmed_at={"warm": 900.0, "evicted": 500.0, "late": 1100.0},
        planned=frozenset({"warm", "evicted", "late"}),
        budget_cut=True,
        restarted_at=800.0,
    )
    observed = {"warm": 5, "evicted": 3, "late": 2, "cut": 4, "fresh": 1}
    seen = {"warm", "evicted", "late", "cut"}
    outcome = window_outcome(WINDOW, observed, state, seen, predicted={"warm": 4.0, "cut": 4.0})
    assert outcome.requests == 15 and outcome.covered == 5
    assert outcome.coverage == 5 / 15
    # warmed before the restart: evicted; planned but warmed after the window began: late;
    # seen, never planned, and the plan cut candidates: cut by the budget.
    assert outcome.misses == {
        "never_planned": 0, "cut_by_budget": 4, "evicted": 3, "warmed_late": 2, "new": 1
    }  # fmt: skip
    assert outcome.predicted == 8.0
    assert outcome.absolute_error == 1 + 3 + 2 + 0 + 1  # warm, evicted, late, cut, fresh
    assert outcome.top[0] == ("warm", 5, True)


def test_without_a_budget_cut_a_seen_item_is_never_planned():
    outcome = window_outcome(WINDOW, {"a": 3}, WarmState(), {"a"})
    assert outcome.misses["never_planned"] == 3 and outcome.covered == 0
    assert outcome.predicted is None and outcome.relative_error is None


keys = st.sampled_from([f"k{n}" for n in range(8)])


@given(
    observed=st.dictionaries(keys, st.integers(1, 50)),
    warmed=st.dictionaries(keys, st.floats(0, 2000)),
    planned=st.frozensets(keys),
    seen=st.frozensets(keys),
    cut=st.booleans(),
    restart=st.none() | st.floats(0, 2000),
)
def test_covered_and_misses_add_up_to_the_requests(observed, warmed, planned, seen, cut, restart):
    state = WarmState(warmed, planned, cut, restart)
    outcome = window_outcome(WINDOW, observed, state, seen)
    assert set(outcome.misses) == set(MISS_CAUSES)
    assert outcome.covered + sum(outcome.misses.values()) == sum(observed.values())
    assert WindowOutcome.from_dict(outcome.to_dict()) == outcome
