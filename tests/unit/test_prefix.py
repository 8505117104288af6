"""Prefix identity: chain hashes name whole prefixes."""

from __future__ import annotations

import re
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.prefix_blocks import (
    _BYTE_CLASSES,
    BlockCursor,
    ascii_block_sizes,
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


#: ASCII that decides pseudo-tokens: word, punctuation, every ASCII white space (\x1c-\x1f are
#: white space to str patterns, not to bytes patterns) and controls that are none of these
_ASCII = st.text(
    alphabet=st.sampled_from("ab1_Z .,!?-<|>\n\t\r\x0b\x0c\x1c\x1f\x00\x7f"), max_size=120
)


def test_ascii_classes_are_those_of_str_patterns():
    for byte in range(128):
        char = chr(byte)
        expected = b"s" if re.match(r"\s", char) else b"w" if re.match(r"\w", char) else b"o"
        assert _BYTE_CLASSES[byte : byte + 1] == expected, repr(char)


@given(st.text(alphabet=st.characters(max_codepoint=127)) | _ASCII, st.sampled_from((1, 2, 3, 16)))
def test_block_cursor_reads_ascii_as_pseudo_tokens(text, block_size):
    ends, hashes = BlockCursor(block_size).blocks(text)
    chain = prefix_chain(text, block_size)
    assert (ends, hashes) == ([b.end for b in chain], [b.hash for b in chain])


@given(
    st.lists(_ASCII | st.sampled_from(("", " ", "\t\x1c \n", "a", " a ", ".."))),
    st.sampled_from((1, 2, 3, 16)),
)
def test_ascii_block_sizes_cut_each_text_as_prefix_chain_does(texts, block_size):
    sizes = iter(ascii_block_sizes(texts, block_size))
    for text in texts:
        ends = [block.end for block in prefix_chain(text, block_size)]
        expected = [end - start for start, end in pairwise([0, *ends])]
        assert list(iter(sizes.__next__, 0)) == expected
    assert next(sizes, None) is None


@given(_ASCII, _ASCII, st.sampled_from((1, 2, 16)))
def test_block_cursor_extends_known_blocks_by_given_sizes(head, tail, block_size):
    text = head + tail
    known_ends, known_hashes = BlockCursor(block_size).blocks(head)
    known = len(known_ends) - 1 if known_ends and known_ends[-1] == len(head) else len(known_ends)
    ends, hashes = known_ends[:known], known_hashes[:known]
    pos = ends[-1] if ends else 0
    sizes = ascii_block_sizes([text[pos:]], block_size)
    BlockCursor(block_size).extend_by_sizes(text[pos:].encode(), pos, sizes, ends, hashes)
    chain = prefix_chain(text, block_size)
    assert (ends, hashes) == ([b.end for b in chain], [b.hash for b in chain])


def test_ascii_block_sizes_refuse_other_text():
    with pytest.raises(ValueError, match="ASCII"):
        ascii_block_sizes(["plain", "café"], 2)
