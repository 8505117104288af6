"""Prefix hashes of many prompts that share their heads, without re-reading the heads.

Requests of one service share long heads (a system prompt, a template's static part), and a
conversation's next prompt repeats the whole previous one. A pseudo-token ending at character
``e`` is decided by the characters before ``e`` and the one at ``e`` (its greedy match stops at
a character it has to read), so every block that ends before the first character where two
prompts differ is the same in both. Prompts are remembered per head, for heads of doubling
lengths: a new prompt finds the latest prompt with its longest known head, and tokenises only
what follows the text the two share: the same hashes as :func:`pipeline.prefix_blocks.block_hashes`.

:meth:`PrefixHasher.hashes_many` hashes many prompts in order, numpy cutting their tails
together: on prompts like a chat log's, about 8 µs a prompt before, 5.5 one at a time now and
4.5-5 many at once.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from pipeline.prefix_blocks import BlockCursor, ascii_block_sizes

#: head lengths (characters) remembered, shortest first: a prompt reuses its longest known head
HEAD_LENGTHS = (128, 256, 512, 1024, 2048, 4096)
#: heads remembered per length; a full table is dropped (cheap, and traffic is bursty). Any
#: remembered stem is only compared with, never trusted, so a dropped or replaced head is only
#: a missed saving, never a wrong hash
HEADS_PER_LENGTH = 1024
#: characters of a remembered prompt kept: at most about twice the heads' own text (8064
#: characters a prompt), so the tables stay within a few tens of MB at worst
STEM_CHARS = 8192
#: prompts whose tails hashes_many cuts together: their arrays stay in a core's cache (2 MiB
#: of L2 here); 256-512 measured fastest, 4096 about 15% slower
BATCH_PROMPTS = 512
#: fewer prompts than this are hashed one at a time: numpy's cost of a batch (about 30 µs)
#: outweighs what it saves below about 40 prompts like a chat log's
SMALL_BATCH = 48

#: a remembered prompt (cut at STEM_CHARS), the ends (characters) and chain hashes of its
#: blocks: all of them, or where the prompt was cut, those that end before the cut (a block
#: that ends at a stem's last character is shared with a prompt only if it is that stem: see
#: shared_blocks)
Stem = tuple[str, list[int], list[str]]
#: how :meth:`PrefixHasher.hashes_many` hashes a prompt: the index of its longest known head's
#: length (-1: none) and that head, the ends and hashes of the blocks it shares with that
#: head's stem, and the ASCII rest of the prompt (from the last shared end) left to cut
Plan = tuple[int, str, list[int], list[str], str]


def shared_blocks(prompt: str, stem: str, ends: list[int], known: int) -> int:
    """How many of the blocks ending at ``ends`` (in ``stem``) are blocks of ``prompt`` too:
    those ending before the first character where the two differ (the first ``known`` agree).
    A block that ends where ``stem`` ends is shared only if ``prompt`` is ``stem``: the slices
    compared then differ in length.

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
        self._tables = [self.heads[n] for n in HEAD_LENGTHS]  # by index: one lookup less

    def hashes(self, prompt: str) -> list[str]:
        """Chain hashes of the whole blocks of ``prompt`` (of many: :meth:`hashes_many`)."""
        at, head, found = self._longest_head(prompt)
        if found is None:
            ends, hashes = self.cursor.extend(prompt, [], [])
        else:
            stem, stem_ends, stem_hashes = found
            whole = shared_blocks(prompt, stem, stem_ends, HEAD_LENGTHS[at])
            ends, hashes = self.cursor.extend(prompt, stem_ends[:whole], stem_hashes[:whole])
        if head:
            self._remember(prompt, at, head, ends, hashes)
        return hashes

    def hashes_many(self, prompts: Sequence[str]) -> list[list[str]]:
        """:meth:`hashes` of each of ``prompts``, in order (the same lists), about 1.2x faster
        than one at a time: their tails are cut into blocks together, BATCH_PROMPTS at a time
        (:func:`~pipeline.prefix_blocks.ascii_block_sizes`)."""
        results: list[list[str]] = []
        for start in range(0, len(prompts), BATCH_PROMPTS):
            results += self._hash_batch(prompts[start : start + BATCH_PROMPTS])
        return results

    def _hash_batch(self, prompts: Sequence[str]) -> list[list[str]]:
        """:meth:`hashes_many` of a batch. Each prompt reuses the stem of its longest head the
        memory knew before the batch; a prompt is hashed alone, in its turn, where its tail
        is not ASCII or its longest head is new in this batch (a conversation's next turn, a
        new system prompt's second request), so that it reuses the prompt that brought it."""
        if len(prompts) < SMALL_BATCH:
            return [self.hashes(prompt) for prompt in prompts]
        news: list[set[str]] = [set() for _ in HEAD_LENGTHS]  # heads this batch brought
        plans = [self._plan(prompt, news) for prompt in prompts]
        tails = [plan[4] for plan in plans if plan is not None]
        sizes = iter(ascii_block_sizes(tails, self.cursor.block_size))
        results = []
        for prompt, plan in zip(prompts, plans, strict=True):
            if plan is None:
                results.append(self.hashes(prompt))
                continue
            at, head, ends, hashes, tail = plan
            self.cursor.extend_by_sizes(tail.encode(), len(prompt) - len(tail), sizes, ends, hashes)
            if head:
                self._remember(prompt, at, head, ends, hashes)
            results.append(hashes)
        return results

    def _plan(self, prompt: str, news: list[set[str]]) -> Plan | None:
        """How :meth:`hashes_many` hashes ``prompt`` (None: alone, in its turn); adds to
        ``news`` its heads longer than any the memory knows."""
        at = bisect_left(HEAD_LENGTHS, len(prompt)) - 1  # heads shorter than the prompt
        head, found = "", None
        while at >= 0:
            head = prompt[: HEAD_LENGTHS[at]]
            found = self._tables[at].get(head)
            if found is not None:
                break
            if head in news[at]:
                return None
            news[at].add(head)
            at -= 1
        if found is None:
            ends, hashes = [], []
        else:
            stem, stem_ends, stem_hashes = found
            whole = shared_blocks(prompt, stem, stem_ends, HEAD_LENGTHS[at])
            ends, hashes = stem_ends[:whole], stem_hashes[:whole]
        tail = prompt[ends[-1] :] if ends else prompt
        return (at, head, ends, hashes, tail) if tail.isascii() else None

    def _longest_head(self, prompt: str) -> tuple[int, str, Stem | None]:
        """The longest remembered head of ``prompt``: the index of its length in
        :data:`HEAD_LENGTHS` (-1: none), that head (or the shortest; "": the prompt is not
        longer) and its stem. Longest first: a prompt that shares a long head is found with
        one lookup."""
        at = bisect_left(HEAD_LENGTHS, len(prompt)) - 1  # heads shorter than the prompt
        head = ""
        while at >= 0:
            head = prompt[: HEAD_LENGTHS[at]]
            hit = self._tables[at].get(head)
            if hit is not None:
                return at, head, hit
            at -= 1
        return -1, head, None

    def _remember(
        self, prompt: str, at: int, head: str, ends: list[int], hashes: list[str]
    ) -> None:
        """Remember ``prompt`` under its heads from its longest known one: ``head``, whose
        length has the index ``at`` (-1: none, and ``head`` is the shortest)."""
        size = len(prompt)
        if size <= STEM_CHARS:  # ``ends`` as it is (no caller holds it), ``hashes`` copied
            entry = (prompt, ends, hashes[:])
        else:  # the blocks that end before the stem's last character
            whole = bisect_left(ends, STEM_CHARS)
            entry = (prompt[:STEM_CHARS], ends[:whole], hashes[:whole])
        # the latest prompt replaces the one its longest known head held (a conversation's
        # next turn then finds the turn before), and fills the longer lengths
        at = max(at, 0)
        while True:
            table = self._tables[at]
            if len(table) >= HEADS_PER_LENGTH and head not in table:
                table.clear()  # only this length: short heads repeat more than long ones
            table[head] = entry
            at += 1
            if at == len(HEAD_LENGTHS) or size <= HEAD_LENGTHS[at]:
                return
            head = prompt[: HEAD_LENGTHS[at]]
