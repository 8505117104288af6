"""Prefix hashes of many prompts that share their heads, without re-reading the heads.

Requests of one service share long heads (a system prompt, a template's static part), and a
conversation's next prompt repeats the whole previous one. A pseudo-token ending at character
``e`` is decided by the characters before ``e`` and the one at ``e`` (its greedy match stops at
a character it has to read), so every block that ends before the first character where two
prompts differ is the same in both. Prompts are remembered per head, for heads of doubling
lengths: a new prompt finds the latest prompt with its longest known head, and tokenises only
what follows the text the two share: the same hashes as :func:`pipeline.prefix.block_hashes`.
"""

from __future__ import annotations

from bisect import bisect_left

from pipeline.prefix import BlockCursor

#: head lengths (characters) remembered, shortest first: a prompt reuses its longest known head
HEAD_LENGTHS = (128, 256, 512, 1024, 2048, 4096)
#: heads remembered per length; a full table is dropped (cheap, and traffic is bursty). Any
#: remembered stem is only compared with, never trusted, so a dropped or replaced head is only
#: a missed saving, never a wrong hash
HEADS_PER_LENGTH = 1024
#: characters of a remembered prompt kept: at most about twice the heads' own text (8064
#: characters a prompt), so the tables stay within a few tens of MB at worst
STEM_CHARS = 8192

#: a remembered prompt (cut at STEM_CHARS), the ends (characters) and chain hashes of its
#: blocks that end before its last character
Stem = tuple[str, list[int], list[str]]


def shared_blocks(prompt: str, stem: str, ends: list[int], known: int) -> int:
    """How many of the blocks ending at ``ends`` (in ``stem``) are blocks of ``prompt`` too:
    those ending before the first character where the two differ (the first ``known`` agree).

    Bisects over the blocks with slice comparisons (C memcmp), a few per prompt.
    """
    good, bad = bisect_left(ends, known), len(ends)
    equal = known  # characters known to agree
    while good < bad:
        mid = (good + bad) // 2
        stop = ends[mid] + 1  # the block's end is decided by the character at its end
        if prompt[equal:stop] == stem[equal:stop]:
            good, equal = mid + 1, stop
        else:
            bad = mid
    return good


class PrefixHasher:
    """``block_hashes`` with a per-head memory of the latest prompt, its block ends and hashes."""

    def __init__(self, block_size: int) -> None:
        self.cursor = BlockCursor(block_size)
        self.heads: dict[int, dict[str, Stem]] = {n: {} for n in HEAD_LENGTHS}

    def hashes(self, prompt: str) -> list[str]:
        """Chain hashes of the whole blocks of ``prompt``."""
        at, found = self._longest_head(prompt)
        if found is None:
            ends, hashes = self.cursor.extend(prompt, [], [])
        else:
            stem, stem_ends, stem_hashes = found
            whole = shared_blocks(prompt, stem, stem_ends, HEAD_LENGTHS[at])
            ends, hashes = self.cursor.extend(prompt, stem_ends[:whole], stem_hashes[:whole])
        if len(prompt) > HEAD_LENGTHS[0]:
            self._remember(prompt, at, ends, hashes)
        return hashes

    def _longest_head(self, prompt: str) -> tuple[int, Stem | None]:
        """The longest remembered head of ``prompt``: the index of its length in
        :data:`HEAD_LENGTHS` (-1: none) and its stem. Longest first: a prompt that shares a
        long head is found with one lookup."""
        at = bisect_left(HEAD_LENGTHS, len(prompt)) - 1  # heads shorter than the prompt
        while at >= 0:
            length = HEAD_LENGTHS[at]
            hit = self.heads[length].get(prompt[:length])
            if hit is not None:
                return at, hit
            at -= 1
        return -1, None

    def _remember(self, prompt: str, at: int, ends: list[int], hashes: list[str]) -> None:
        stem = prompt[:STEM_CHARS]
        whole = bisect_left(ends, len(stem))  # blocks ending before the stem's last character
        entry = (stem, ends[:whole], hashes[:whole])
        # the latest prompt replaces the one its longest known head held (a conversation's
        # next turn then finds the turn before), and fills the longer lengths
        for length in HEAD_LENGTHS[max(0, at) :]:
            if len(prompt) <= length:
                break
            table, head = self.heads[length], prompt[:length]
            if len(table) >= HEADS_PER_LENGTH and head not in table:
                table.clear()  # only this length: short heads repeat more than long ones
            table[head] = entry
