"""Prefix identity: chain hashes name whole prefixes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pipeline.prefix import (
    block_hashes,
    block_hashes_from_ids,
    count_tokens,
    prefix_chain,
    pseudo_token_spans,
    shared_prefix_length,
)

SYSTEM = "You are a careful assistant for the billing team. Answer in one short paragraph. " * 3


def test_shared_head_gives_shared_leading_hashes():
    a = block_hashes(SYSTEM + "What is my balance today?", block_size=8)
    b = block_hashes(SYSTEM + "Cancel my order number 12 please, now.", block_size=8)
    assert shared_prefix_length([a, b]) >= count_tokens(SYSTEM) // 8 - 1
    assert a != b


def test_chain_hash_depends_on_everything_before():
    a = block_hashes("alpha beta gamma delta " * 4, block_size=4)
    b = block_hashes("omega beta gamma delta " + "alpha beta gamma delta " * 3, block_size=4)
    assert a[1] != b[1]  # block 1 has equal text but a different history


def test_partial_last_block_is_not_a_prefix():
    assert prefix_chain("one two three", block_size=4) == []
    assert len(prefix_chain("one two three four", block_size=4)) == 1


def test_block_end_offsets_cut_the_prompt_at_the_prefix():
    prompt = SYSTEM + "tail"
    for block in prefix_chain(prompt, block_size=8):
        assert block_hashes(prompt[: block.end], block_size=8)[-1] == block.hash


def test_ids_and_text_hashes_never_collide():
    assert block_hashes_from_ids([1, 2, 3, 4], 4) != block_hashes("1 2 3 4", 4)


@given(st.text())
def test_spans_tile_any_text(text):
    spans = pseudo_token_spans(text)
    assert "".join(text[a:b] for a, b in spans) == text
