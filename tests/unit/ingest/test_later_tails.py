"""The tails each piece is finished with: one linear pass gives what the definition gives."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pipeline.ingest.assemble import later_tails

IDS = st.sampled_from(["a", "b", "c", "d"])
#: a piece's tail keys: an id, or an id with the line of a reuse ("a\x007")
KEYS = st.one_of(IDS, st.builds(lambda i, n: f"{i}\x00{n}", IDS, st.integers(1, 9)))
PIECES = st.lists(st.tuples(st.lists(KEYS, max_size=4), st.lists(IDS, max_size=3)), max_size=7)


def _by_definition(
    tails: list[dict[str, dict[str, Any]]], heads: list[list[str]], index: int
) -> dict[str, dict[str, Any]]:
    """Every later piece in turn: a tail counts unless its id was already taken, or a piece
    in between holds a head with it."""
    later: dict[str, dict[str, Any]] = {}
    claimed: set[str] = set()
    for piece, head_ids in zip(tails[index + 1 :], heads[index + 1 :], strict=True):
        for key, tail in piece.items():
            base = key.split("\x00", 1)[0]
            if base not in claimed and base not in later:
                later[base] = tail
        claimed.update(head_ids)
    return later


@given(PIECES)
def test_later_tails_are_those_of_the_definition(pieces):
    tails = [{key: {"piece": j, "key": key} for key in keys} for j, (keys, _) in enumerate(pieces)]
    heads = [list(head_ids) for _, head_ids in pieces]
    got = list(later_tails(tails, heads))
    want = [_by_definition(tails, heads, i) for i in range(len(pieces))]
    assert [list(g.items()) for g in got] == [list(w.items()) for w in want]  # order too
