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

import numpy as np

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


def _ascii_class(byte: int) -> bytes:
    """The class of an ASCII byte as Python's str patterns see it: ``s`` white space
    (``str.isspace``: also \\x1c-\\x1f, unlike a bytes pattern's ``\\s``), ``w`` word
    (``\\w``), ``o`` other."""
    char = chr(byte)
    return b"s" if char.isspace() else b"w" if char.isalnum() or char == "_" else b"o"


#: ``bytes.translate`` table of the classes of ASCII bytes (an ASCII prompt has no others)
_BYTE_CLASSES = b"".join(map(_ascii_class, range(128))) + b"o" * 128
_SPACE = _BYTE_CLASSES[ord(" ")]


def _block_pattern(block_size: int, token: str, space: str) -> str:
    """A block of ``block_size`` pseudo-tokens (``token``: one, with its trailing white space)
    or, in a group, the rest of a prompt where no block is left: see :class:`BlockCursor`."""
    blank = rf"|{space}++" if block_size == 1 else ""
    # unrolled: about 10% faster than {block_size}, and 40% on the classes of ASCII bytes
    return rf"({space}*+{token * block_size}{blank})|[\s\S]+"


#: a pseudo-token of text: each part possessive
_TEXT_TOKEN = r"(?:\w++|[^\w\s]++)\s*+"
#: a pseudo-token of the classes of ASCII bytes; a run led by its letter lets the alternation
#: skip the other run at once (about 5% faster; slower with the str classes)
_CLASS_TOKEN = r"(?:ww*+|oo*+)s*+"


class BlockCursor:
    """Whole blocks of a prompt, read by one regex call.

    One pattern matches ``block_size`` pseudo-tokens at once; each part of a token is
    possessive, so it matches exactly what :data:`_PSEUDO_TOKEN` matches at that position (no
    backtracking into a token to make a block fit), and the match fails where fewer tokens
    remain. A token's trailing white space is its own, so only a prompt's first token can
    start with white space (the leading ``\\s*+``), and a token of white space alone is a
    whole prompt of white space (a block only when blocks are one token).

    ``findall`` reads all the blocks in one call: the pattern is a block (in a group) or, where
    no block is left, the rest of the prompt, which comes back as an empty group. An ASCII
    prompt is read as the class of each byte (one ``bytes.translate``): literal runs match
    about 2x faster than Unicode classes.
    """

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        self.block_size = block_size
        self._text_blocks = re.compile(_block_pattern(block_size, _TEXT_TOKEN, r"\s"))
        self._class_blocks = re.compile(_block_pattern(block_size, _CLASS_TOKEN, "s").encode())
        # a copy of an empty hasher costs about half of blake2b(..., digest_size=8)
        self._new_hash = hashlib.blake2b(digest_size=8).copy

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
        if prompt.isascii():
            tail = prompt[pos:].encode()
            runs = self._class_blocks.findall(tail.translate(_BYTE_CLASSES))
            self.extend_by_sizes(tail, pos, map(len, runs), ends, hashes)
        else:
            texts = self._text_blocks.findall(prompt, pos)
            payloads = [text.encode() for text in texts if text]  # "": the rest (see above)
            for text in texts[: len(payloads)]:
                pos += len(text)
                ends.append(pos)
            self._chain(payloads, hashes)
        return ends, hashes

    def extend_by_sizes(
        self, tail: bytes, pos: int, sizes: Iterable[int], ends: list[int], hashes: list[str]
    ) -> None:
        """Append to ``ends`` and ``hashes`` the blocks of ``tail``, the ASCII rest of a prompt
        from ``pos``, whose blocks are ``sizes`` bytes long one after the other (up to a 0, if
        any). Cuts and hashes in one loop: a list of payloads and a second loop cost about
        5% of a prompt."""
        link = hashes[-1].encode() + b"\x00" if hashes else b"\x00"
        new_hash, add_hash, add_end = self._new_hash, hashes.append, ends.append
        start = 0
        for size in sizes:
            if not size:
                break  # the rest of the prompt: fewer than block_size tokens
            stop = start + size
            digest = new_hash()
            digest.update(link)
            digest.update(tail[start:stop])
            name = digest.hexdigest()
            add_hash(name)
            add_end(pos + stop)
            link, start = name.encode() + b"\x00", stop

    def _chain(self, payloads: list[bytes], hashes: list[str]) -> None:
        """Append to ``hashes`` the chain hashes of the blocks ``payloads`` that follow it."""
        link = hashes[-1].encode() + b"\x00" if hashes else b"\x00"
        new_hash, add_hash = self._new_hash, hashes.append
        for payload in payloads:
            digest = new_hash()
            digest.update(link)
            digest.update(payload)
            name = digest.hexdigest()
            add_hash(name)
            link = name.encode() + b"\x00"


def ascii_block_sizes(texts: Sequence[str], block_size: int) -> list[int]:
    """The lengths of the whole blocks of each of ``texts`` (ASCII), each read as a prompt on
    its own (as :class:`BlockCursor` cuts it), text after text, each text's followed by a 0.
    For many texts at once: numpy over all their bytes is about 4x faster than the regex on
    tails of a few hundred characters."""
    starts, bounds = _ascii_token_starts(texts)
    first = np.searchsorted(starts, bounds)  # each text's first token (the last: none's)
    tokens = np.maximum(np.diff(first), np.diff(bounds) > 0)  # white space alone: one token
    blocks = tokens // block_size
    text = np.repeat(np.arange(len(texts)), blocks)  # the text of each block
    nth = np.arange(len(text)) - (np.cumsum(blocks) - blocks)[text] + 1  # from 1 in its text
    # a block ends where the token after it starts or, the last token of its text, where the
    # text ends (the token after it, if any, is the next text's)
    after = np.append(starts, bounds[-1])[np.minimum(first[text] + nth * block_size, len(starts))]
    ends = np.minimum(after, bounds[1:][text])
    begins = np.where(nth == 1, bounds[:-1][text], np.roll(ends, 1))
    sizes = np.zeros(len(text) + len(texts), np.int64)
    sizes[np.arange(len(text)) + text] = ends - begins  # and a 0 after each text's
    return sizes.tolist()


def _ascii_token_starts(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Where the pseudo-tokens of ``texts`` (ASCII) start in the texts joined, and where each
    text starts (then where the last ends). A token starts at a non-space character that
    follows white space or a character of the other class, or that starts its text."""
    joined = "".join(texts).encode()
    bounds = np.zeros(len(texts) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)), out=bounds[1:])
    if len(joined) != bounds[-1]:  # a character would not be a byte
        raise ValueError("pseudo-tokens are cut with numpy in ASCII texts only")
    classes = np.frombuffer(joined.translate(_BYTE_CLASSES), np.uint8)
    before = np.empty_like(classes)  # the class of the character before, in the same text
    before[1:] = classes[:-1]
    before[bounds[:-1][np.diff(bounds) > 0]] = _SPACE
    return np.flatnonzero((classes != _SPACE) & (classes != before)), bounds


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
