"""The simulator's prefix cache: fixed-size blocks named by chain hashes, evicted LRU.

Like vLLM's automatic prefix caching, a block can only be reused when every block before it is
cached too (the hash of block *i* covers blocks 0..i), and only whole blocks count. At least the
last prompt token is always recomputed, so a prompt that is entirely cached still pays one token.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CacheLookup:
    """Result of matching a prompt's block chain against the cache."""

    hit_blocks: int
    query_blocks: int


class BlockPrefixCache:
    """An LRU set of block hashes with a capacity in blocks."""

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ValueError("capacity_blocks must be at least 1")
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[str, None] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._blocks

    @property
    def usage(self) -> float:
        """Share of the capacity in use, 0..1."""
        return len(self._blocks) / self.capacity_blocks

    def lookup(self, chain: Sequence[str]) -> CacheLookup:
        """Count the leading blocks of ``chain`` that are cached, and mark them recently used."""
        hits = 0
        for block_hash in chain:
            if block_hash not in self._blocks:
                break
            self._blocks.move_to_end(block_hash)
            hits += 1
        return CacheLookup(hit_blocks=hits, query_blocks=len(chain))

    def insert(self, chain: Sequence[str]) -> list[str]:
        """Store every block of ``chain`` (most recent last), evicting the least recently used;
        returns the evicted blocks."""
        for block_hash in chain:
            if block_hash in self._blocks:
                self._blocks.move_to_end(block_hash)
            else:
                self._blocks[block_hash] = None
        evicted = []
        while len(self._blocks) > self.capacity_blocks:
            evicted.append(self._blocks.popitem(last=False)[0])
            self.evictions += 1
        return evicted

    def clear(self) -> int:
        """Drop every block (as a restart or ``/reset_prefix_cache`` does); returns how many."""
        dropped = len(self._blocks)
        self._blocks.clear()
        return dropped
