"""Prefix hashes read faster must be the hashes of :func:`pipeline.prefix.prefix_chain`."""

from __future__ import annotations

from bisect import bisect_left

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.ingest.hashing import HEAD_LENGTHS, STEM_CHARS, PrefixHasher, shared_blocks
from pipeline.prefix import BlockCursor, block_hashes, prefix_chain

#: characters that decide pseudo-tokens: word, punctuation, white space (and non-ASCII ones)
_TEXT = st.text(alphabet=st.sampled_from("ab1_ é.,!?-\n\t\u00a0\u2003µ€"), max_size=300)


@given(st.text(), st.sampled_from((1, 2, 3, 16)))
def test_block_cursor_cuts_where_pseudo_tokens_cut(text, block_size):
    ends, hashes = BlockCursor(block_size).blocks(text)
    chain = prefix_chain(text, block_size)
    assert ends == [b.end for b in chain]
    assert hashes == [b.hash for b in chain]


@given(_TEXT, st.sampled_from((1, 2, 16)))
def test_block_cursor_on_white_space_and_punctuation(text, block_size):
    ends, hashes = BlockCursor(block_size).blocks(text)
    assert hashes == [b.hash for b in prefix_chain(text, block_size)]
    assert ends == [b.end for b in prefix_chain(text, block_size)]


@given(_TEXT, _TEXT, st.text(max_size=20), st.sampled_from((1, 2, 16)))
def test_shared_blocks_end_before_the_first_difference(a, b, head, block_size):
    stem, prompt = head + a, head + b
    ends = BlockCursor(block_size).blocks(stem)[0]
    ends = ends[: bisect_left(ends, len(stem))]  # as remembered: blocks ending inside
    n = shared_blocks(prompt, stem, ends, len(head))
    common = 0
    while common < min(len(stem), len(prompt)) and stem[common] == prompt[common]:
        common += 1
    assert n == bisect_left(ends, common)


@settings(max_examples=60)
@given(
    st.lists(_TEXT.filter(lambda t: len(t) > 20), min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5000), _TEXT), max_size=25),
    st.sampled_from((1, 4, 16)),
)
def test_hasher_gives_the_hashes_of_each_prompt_alone(heads, picks, block_size):
    hasher = PrefixHasher(block_size)
    previous = ""
    for head, cut, tail in picks:
        base = (heads[head % len(heads)] * 300)[: 100 + cut]
        # half the prompts extend the one before (a conversation's next turn)
        prompt = previous + tail if cut % 2 and previous else base + tail
        assert hasher.hashes(prompt) == block_hashes(prompt, block_size)
        previous = prompt


def test_hasher_reuses_long_conversations_past_the_stem():
    words = "alpha beta, gamma! delta\n" * 1000
    hasher = PrefixHasher(16)
    turns = [words[: HEAD_LENGTHS[-1] * 3 + i * 997] + f" turn {i}?" for i in range(5)]
    assert len(turns[-1]) > STEM_CHARS
    for prompt in turns + turns[::-1]:
        assert hasher.hashes(prompt) == block_hashes(prompt, 16)
