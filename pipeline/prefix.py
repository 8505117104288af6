"""Prefix identity: prompts cut into fixed-size blocks of tokens, each named by a chain hash.

The hash of block *i* covers blocks 0..i, as an engine's prefix cache does, so one hash names a
whole prefix. Where the real tokenizer is unknown (a log carries only text), prompts are cut into
*pseudo-tokens*: a run of word characters, a run of other non-space characters, each with its
trailing white space. On English text and code that is within about 30% of a BPE token count —
enough to rank prefixes and budget cache capacity, never used as an engine's exact count.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEFAULT_BLOCK_SIZE = 16
_PSEUDO_TOKEN = re.compile(r"\s*(?:\w+|[^\w\s]+)\s*|\s+", re.UNICODE)


@dataclass(frozen=True, slots=True)
class PrefixBlock:
    """One block of a prompt: ``hash`` names the prefix ending at ``end`` (a character offset)."""

    hash: str
    end: int
    tokens: int


def pseudo_token_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the pseudo-tokens of ``text``; they tile the text exactly."""
    return [match.span() for match in _PSEUDO_TOKEN.finditer(text)]


def count_tokens(text: str) -> int:
    """Estimated token count of ``text`` (pseudo-tokens)."""
    return sum(1 for _ in _PSEUDO_TOKEN.finditer(text))


def _chain(previous: str, payload: bytes) -> str:
    digest = hashlib.blake2b(previous.encode() + b"\x00" + payload, digest_size=8)
    return digest.hexdigest()


def prefix_chain(prompt: str, block_size: int = DEFAULT_BLOCK_SIZE) -> list[PrefixBlock]:
    """Whole blocks of ``prompt`` with their chain hashes; a partial last block is not a prefix."""
    spans = pseudo_token_spans(prompt)
    blocks: list[PrefixBlock] = []
    previous = ""
    for start in range(0, len(spans) - block_size + 1, block_size):
        first, last = spans[start][0], spans[start + block_size - 1][1]
        previous = _chain(previous, prompt[first:last].encode())
        blocks.append(PrefixBlock(previous, last, (start + block_size)))
    return blocks


def pseudo_tokens(text: str) -> list[str]:
    """The pseudo-tokens of ``text`` as strings; joined, they give ``text`` back."""
    return _PSEUDO_TOKEN.findall(text)


def chain_hashes(
    tokens: Sequence[str], block_size: int = DEFAULT_BLOCK_SIZE, known: Sequence[str] = ()
) -> list[str]:
    """Chain hashes of the whole blocks of ``tokens``; ``known`` are the hashes of its first
    blocks when already computed (they are kept, the chain continues from the last)."""
    hashes = list(known)
    previous = hashes[-1] if hashes else ""
    for start in range(len(hashes) * block_size, len(tokens) - block_size + 1, block_size):
        previous = _chain(previous, "".join(tokens[start : start + block_size]).encode())
        hashes.append(previous)
    return hashes


def block_hashes(prompt: str, block_size: int = DEFAULT_BLOCK_SIZE) -> list[str]:
    """Chain hashes of the whole blocks of ``prompt`` (the hashes of :func:`prefix_chain`).

    The pseudo-tokens tile the text, so a block's text is the join of its tokens' texts;
    ``findall`` avoids a match object per token (about 3x faster on long prompts).
    """
    return chain_hashes(pseudo_tokens(prompt), block_size)


def block_hashes_from_ids(
    token_ids: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE
) -> list[str]:
    """Chain hashes of whole blocks of real token ids (when a log carries them)."""
    hashes: list[str] = []
    previous = ""
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        payload = ",".join(map(str, token_ids[start : start + block_size])).encode()
        previous = _chain(previous, b"ids:" + payload)
        hashes.append(previous)
    return hashes


def shared_prefix_length(chains: Iterable[Sequence[str]]) -> int:
    """Number of leading blocks every chain in ``chains`` has in common."""
    iterator = iter(chains)
    common = list(next(iterator, []))
    for chain in iterator:
        n = 0
        while n < min(len(common), len(chain)) and common[n] == chain[n]:
            n += 1
        common = common[:n]
    return len(common)
