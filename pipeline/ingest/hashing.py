"""Prefix hashes of many prompts that share their heads, without re-reading the heads.

Requests of one service share long heads (a system prompt, a template's static part). A
pseudo-token ending at character ``e`` is decided by the characters before ``e`` and the one
at ``e`` (its greedy match stops at a character it has to read), so every block that ends
before a head's last character is the same in any prompt with that head. Such blocks are
remembered per head, for heads of doubling lengths, and a prompt with a known head tokenises
only what follows: the same hashes as :func:`pipeline.prefix.block_hashes`.
"""

from __future__ import annotations

from bisect import bisect_left

from pipeline.prefix import BlockCursor

#: head lengths (characters) remembered, shortest first: a prompt reuses its longest known head
HEAD_LENGTHS = (128, 256, 512, 1024, 2048, 4096)
#: heads remembered per length; a full table is dropped (cheap, and traffic is bursty). A
#: lookup stops at the first unknown length, so a long head known without its short head
#: (dropped) is only a missed saving, never a wrong hash
HEADS_PER_LENGTH = 1024

Blocks = tuple[list[int], list[str]]  # block ends (characters) and chain hashes


class PrefixHasher:
    """``block_hashes`` with a per-head memory of block ends and hashes."""

    def __init__(self, block_size: int) -> None:
        self.cursor = BlockCursor(block_size)
        self.heads: dict[int, dict[str, Blocks]] = {n: {} for n in HEAD_LENGTHS}

    def hashes(self, prompt: str) -> list[str]:
        """Chain hashes of the whole blocks of ``prompt``."""
        known, first_missing = self._longest_head(prompt)
        ends, hashes = self.cursor.blocks(prompt, *known)
        if first_missing is not None:
            self._remember(prompt, first_missing, ends, hashes)
        return hashes

    def _longest_head(self, prompt: str) -> tuple[Blocks, int | None]:
        """Blocks of the longest remembered head; index of the first head length unknown."""
        known: Blocks = ([], [])
        for i, length in enumerate(HEAD_LENGTHS):
            if len(prompt) <= length:
                return known, None
            hit = self.heads[length].get(prompt[:length])
            if hit is None:
                return known, i
            known = hit
        return known, None

    def _remember(self, prompt: str, first: int, ends: list[int], hashes: list[str]) -> None:
        for length in HEAD_LENGTHS[first:]:
            if len(prompt) <= length:
                break
            table = self.heads[length]
            if len(table) >= HEADS_PER_LENGTH:
                table.clear()  # only this length: short heads repeat more than long ones
            whole = bisect_left(ends, length)  # blocks ending before the head's last character
            table[prompt[:length]] = (ends[:whole], hashes[:whole])
