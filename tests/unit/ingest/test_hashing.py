"""Prefix hashes read faster must be the hashes of :func:`pipeline.prefix_blocks.prefix_chain`."""

from __future__ import annotations

from bisect import bisect_left

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.ingest import hashing
from pipeline.ingest.hashing import HEAD_LENGTHS, STEM_CHARS, PrefixHasher, shared_blocks
from pipeline.prefix_blocks import BlockCursor, block_hashes, prefix_chain

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


#: ASCII (the tails hashes_many cuts with numpy), every ASCII white space among them
_ASCII_TEXT = st.text(alphabet=st.sampled_from("ab1_ .,!?-<|>\n\t\x0b\x1c\x1f"), max_size=300)
#: prompts hashed alone or cut at once whatever their heads: empty, white space alone, short
_LOOSE = st.sampled_from(("", " ", "\t\x1c\n ", "\u2003 ", "a", "é b", "?" * 40))


def _chain_hashes(prompt: str, block_size: int) -> list[str]:
    return [block.hash for block in prefix_chain(prompt, block_size)]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(_ASCII_TEXT.filter(lambda t: len(t) > 20) | _TEXT, min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5000), _ASCII_TEXT | _TEXT), max_size=30),
    st.lists(st.tuples(st.integers(0, 40), _LOOSE), max_size=5),
    st.sampled_from((1, 2, 16)),
    st.integers(1, 9),
    st.integers(0, 40),
    st.data(),
)
def test_hashes_many_gives_the_hashes_of_each_prompt_alone(
    heads, picks, loose, block_size, batch, split, data
):
    prompts, previous = [], ""
    for head, cut, tail in picks:
        base = (heads[head % len(heads)] * 300)[: 100 + cut]
        # half the prompts extend the one before (a conversation's next turn), some repeat it
        prompt = previous + tail if cut % 2 and previous else base + tail
        prompts += [prompt] * (1 + (cut % 7 == 0))
        previous = prompt
    for at, prompt in loose:
        prompts.insert(at, prompt)
    hasher = PrefixHasher(block_size)
    one_by_one = data.draw(st.integers(0, len(prompts)))  # between two batches of calls
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hashing, "BATCH_PROMPTS", batch)  # batches end anywhere
        patch.setattr(hashing, "SMALL_BATCH", 2)
        got = hasher.hashes_many(prompts[:split])
        got += [hasher.hashes(prompt) for prompt in prompts[split:one_by_one]]
        got += hasher.hashes_many(prompts[max(split, one_by_one) :])
    assert got == [_chain_hashes(prompt, block_size) for prompt in prompts]


def test_hashes_many_of_a_conversation_in_one_batch():
    words = "alpha beta, gamma! delta\n" * 1000
    turns = [words[: 300 + 1500 * i] + f" turn {i}?" for i in range(16)]
    assert len(turns[-1]) > STEM_CHARS
    prompts = turns + turns[::-1] + ["é" + turn for turn in turns]
    hasher = PrefixHasher(16)
    assert len(prompts) >= hashing.SMALL_BATCH  # cut at once
    assert hasher.hashes_many(prompts) == [_chain_hashes(p, 16) for p in prompts]
    assert hasher.hashes_many([]) == []


@given(_TEXT, _TEXT, st.text(max_size=20), st.sampled_from((1, 2, 16)))
def test_shared_blocks_of_a_whole_stem(a, b, head, block_size):
    # a remembered stem keeps the block that ends at its last character: shared only with
    # the stem itself
    stem, prompt = head + a, head + b
    ends = BlockCursor(block_size).blocks(stem)[0]
    common = 0
    while common < min(len(stem), len(prompt)) and stem[common] == prompt[common]:
        common += 1
    expected = len(ends) if prompt == stem else bisect_left(ends, common)
    assert shared_blocks(prompt, stem, ends, len(head)) == expected
    assert shared_blocks(stem, stem, ends, len(head)) == len(ends)
