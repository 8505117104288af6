"""The model of vLLM's free-queue prefix cache used to bound the half-cache benchmark."""

from __future__ import annotations

from benchmarks.engines.cache_model import FreeQueueCache


def _prompt(template: int, blocks: int, tail: int = 10) -> list[int]:
    """Token ids: ``blocks`` whole blocks of 4 tokens unique to ``template``, then a tail."""
    return [template * 1000 + i for i in range(blocks * 4)] + [template * 1000 + 999] * tail


def test_a_primed_head_is_reused_and_a_new_one_is_not():
    cache = FreeQueueCache(blocks=20, block_tokens=4)
    assert cache.request(_prompt(1, 3, tail=0), 1) == 0
    assert cache.request(_prompt(1, 3), 1) == 12
    assert cache.request(_prompt(2, 3), 1) == 0


def test_the_last_token_is_always_recomputed():
    cache = FreeQueueCache(blocks=20, block_tokens=4)
    cache.request(_prompt(1, 2, tail=0), 1)
    assert cache.request(_prompt(1, 2, tail=0), 1) == 4  # 8 tokens: only the first block


def test_misses_evict_the_least_recently_freed_blocks_tail_first():
    cache = FreeQueueCache(blocks=8, block_tokens=4)
    cache.request(_prompt(1, 3, tail=0), 1)  # 4 blocks (3 + output), freed tail first
    cache.request(_prompt(2, 3, tail=0), 1)  # 4 more: the queue is full of cached blocks
    # 2 blocks from the head of the queue: template 1's output block, then its last whole block
    cache.request(_prompt(3, 1, tail=0), 1)
    assert cache.peek(_prompt(1, 3)) == 8
    assert cache.peek(_prompt(2, 3)) == 12
    cache.request(_prompt(4, 3, tail=0), 1)  # 4 more: the rest of template 1 and 2 of template 2
    assert cache.peek(_prompt(1, 3)) == 0
    assert cache.peek(_prompt(2, 3)) == 8
