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


def test_uncached_blocks_are_reused_first_then_cached_ones_oldest_first_tail_first():
    cache = FreeQueueCache(blocks=8, block_tokens=4)
    cache.request(_prompt(1, 3, tail=0), 1)  # 3 cached blocks and 1 output block
    cache.request(_prompt(2, 3, tail=0), 1)  # the same: all 8 blocks used once
    cache.request(_prompt(3, 1, tail=0), 1)  # 2 blocks: the two output blocks, nothing evicted
    assert cache.peek(_prompt(1, 3)) == 12 and cache.peek(_prompt(2, 3)) == 12
    cache.request(_prompt(4, 3, tail=0), 1)  # 1 output block, then the oldest: template 1
    assert cache.peek(_prompt(1, 3)) == 0 and cache.peek(_prompt(2, 3)) == 12
    cache.request(_prompt(5, 1, tail=0), 1)  # 1 output block, then template 2's last block
    assert cache.peek(_prompt(2, 3)) == 8


def _word_tokenizer():
    """Words as tokens (ids by a stable table) and the engine model's chat template shape."""
    from jinja2 import Template

    from benchmarks.engines.cache_model import Tokenizer

    table: dict[str, int] = {}

    def encode(text: str, special: bool) -> list[int]:
        ids = [table.setdefault(word, len(table) + 10) for word in text.split(" ")]
        return [1, *ids] if special else ids

    chat = Template("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }}"
                    "{{ eos_token }} {% endfor %}{% if add_generation_prompt %}<|assistant|> "
                    "{% endif %}")  # fmt: skip
    return Tokenizer(encode, chat)


def test_prewarms_arm_is_the_planner_one_item_per_template_within_the_cache():
    from benchmarks.engines.cache_model import Prompts, item_ids, plan_of, replay_newest
    from benchmarks.engines.workload import build_workload

    tokenizer = _word_tokenizer()
    workload = build_workload(tokenizer.count, n_history=150, n_future=60, seed=0)
    seen = {r.template for r in workload.history}
    roomy = plan_of(Prompts(workload, tokenizer), workload.history, blocks=1024)
    assert roomy.notes[0] == "reason: cli" and len(roomy.items) == len(seen)  # every one seen
    replayed = replay_newest(Prompts(workload, tokenizer), workload.history, workload.future)
    assert len(replayed) == len(seen)
    primed = sum(len(item_ids(Prompts(workload, tokenizer), i)) for i in roomy.items)
    assert primed <= sum(map(len, replayed))  # heads only: never more tokens than the replay
    half = plan_of(Prompts(workload, tokenizer), workload.history, blocks=64)
    kept = sum(len(item_ids(Prompts(workload, tokenizer), i)) // 128 for i in half.items)
    assert 0 < len(half.items) < len(seen) and kept <= 63 - 1
