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
    """Chain hashes of the whole blocks of ``prompt`` (the hashes of :func:`prefix_chain`)."""
    return BlockCursor(block_size).blocks(prompt)[1]


class BlockCursor:
    """Whole blocks of a prompt, read one block per regex match.

    One pattern matches ``block_size`` pseudo-tokens at once; each part of a token is
    possessive, so it matches exactly what :data:`_PSEUDO_TOKEN` matches at that position (no
    backtracking into a token to make a block fit), and the match fails where fewer tokens
    remain. That reads a prompt without a string per token (about 1.5x faster than ``findall``
    + join). A token's trailing white space is its own, so only a prompt's first token can
    start with white space (the leading ``\\s*+``), and a token of white space alone is a
    whole prompt of white space (a block only when blocks are one token). Written this way
    rather than as :data:`_PSEUDO_TOKEN` in an atomic group: about 25% faster.
    """

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        blank = r"|\s++" if block_size == 1 else ""
        block = rf"\s*+(?:(?:\w++|[^\w\s]++)\s*+){{{block_size}}}{blank}"
        self.block = re.compile(block, re.UNICODE)

    def blocks(
        self, prompt: str, ends: Sequence[int] = (), hashes: Sequence[str] = ()
    ) -> tuple[list[int], list[str]]:
        """Ends and chain hashes of the whole blocks of ``prompt``; ``ends``/``hashes`` are
        those of its first blocks when already known (the chain continues from the last)."""
        return self.extend(prompt, list(ends), list(hashes))

    def extend(
        self, prompt: str, ends: list[int], hashes: list[str]
    ) -> tuple[list[int], list[str]]:
        """:meth:`blocks`, appending to ``ends`` and ``hashes`` in place."""
        pos = ends[-1] if ends else 0
        previous = hashes[-1].encode() if hashes else b""
        match, blake2b = self.block.match, hashlib.blake2b
        add_end, add_hash = ends.append, hashes.append
        while (found := match(prompt, pos)) is not None:
            end = found.end()
            name = blake2b(previous + b"\x00" + prompt[pos:end].encode(), digest_size=8).hexdigest()
            add_end(end)
            add_hash(name)
            previous, pos = name.encode(), end
        return ends, hashes


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
