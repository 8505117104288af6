"""What a replica holds, from its events: the real vLLM capture and constructed streams."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEventDecoder,
    hash_key,
)
from pipeline.kv_holdings import (
    KEY_PREFIX,
    KV_COUNT_DTYPES,
    ReplicaHoldings,
    chain_content_keys,
    chain_held,
    restore_candidates,
)
from pipeline.kv_snapshot import holdings_from_bytes, holdings_to_bytes
from pipeline.planner.plan import WarmItem
from tests.unit.kv.test_kv_events import DATA, captured


def real_holdings() -> tuple[ReplicaHoldings, list[EventBatch]]:
    decoder = KvEventDecoder()
    batches = [m.batch for m in map(decoder.decode_frames, captured("pub")) if m]
    holdings = ReplicaHoldings("vllm", window_s=60)
    for batch in batches:
        holdings.apply(batch)
    return holdings, batches


def test_real_stream_leaves_what_vllm_holds():
    holdings, batches = real_holdings()
    # the last batch cleared the cache, then stored the 4-block head again
    last = batches[-1].events[-1]
    assert isinstance(last, BlockStored)
    assert holdings.held == {hash_key(h) for h in last.block_hashes}
    assert holdings.resets == 1 and holdings.lost_at_reset > 0
    stored = sum(len(e.block_hashes) for b in batches[:-1] for e in b.events
                 if isinstance(e, BlockStored))  # fmt: skip
    removed = sum(len(e.block_hashes) for b in batches for e in b.events
                  if isinstance(e, BlockRemoved))  # fmt: skip
    assert len(holdings.before_reset) == stored - removed
    assert len(holdings.before_reset) <= 39  # 40 blocks, one of them vLLM's null block
    assert holdings.block_size == 128


def test_real_chain_rebuilds_the_prompt_token_ids():
    holdings, batches = real_holdings()
    head, extension = batches[0].events[0], batches[1].events[0]
    assert isinstance(head, BlockStored) and isinstance(extension, BlockStored)
    leaf = hash_key(extension.block_hashes[-1])
    ids = holdings.token_ids(leaf)
    assert ids == tuple(head.token_ids) + tuple(extension.token_ids)
    assert len(holdings.chain(leaf)) == 6


def test_real_salt_is_carried_to_the_whole_chain():
    holdings, batches = real_holdings()
    salted = batches[2].events[0]
    assert isinstance(salted, BlockStored)
    for raw in salted.block_hashes:
        assert holdings.known[hash_key(raw)].salt == "tenant-a"
    assert holdings.known[hash_key(batches[0].events[0].block_hashes[0])].salt is None


def test_real_restore_candidates_prime_exact_token_ids():
    holdings, batches = real_holdings()
    items = restore_candidates(holdings, "tiny-llama")
    assert items and all(i.token_ids and i.tokens == len(i.token_ids) for i in items)
    assert all(i.tokens % 128 == 0 and i.text == "" for i in items)
    # every candidate is a chain the replica held before the reset
    assert all(i.key[len(KEY_PREFIX) :] in holdings.before_reset for i in items)
    # chains evicted before the reset are still known: restorable when asked for by key
    head, salted = batches[0].events[0], batches[2].events[0]
    assert isinstance(head, BlockStored) and isinstance(salted, BlockStored)
    keys = [hash_key(head.block_hashes[-1]), hash_key(salted.block_hashes[-1])]
    chosen = {i.tenant: i for i in restore_candidates(holdings, "tiny-llama", keys=keys)}
    assert chosen["tenant-a"].params == {"cache_salt": "tenant-a"}
    assert chosen["default"].params == {} and chosen["default"].token_ids == tuple(head.token_ids)
    assert chosen["tenant-a"].token_ids == tuple(salted.token_ids)
    again = WarmItem.from_dict(json.loads(json.dumps(items[0].to_dict())))
    assert again == items[0]


def test_real_requests_prove_exact_priming_hits():
    meta = json.loads((DATA / "vllm-0.32.0-cpu.json").read_text())
    by_ids = [r for r in meta["requests"] if not isinstance(r["request"]["prompt"], str)
              or r["request"]["prompt"].startswith("<")]  # fmt: skip
    # the event's own 512 token ids (+3) were served 512 tokens from cache by vLLM
    assert by_ids and by_ids[0]["cached"] == 512


def stored(hashes, parent, size=2, ts=0.0, lora=None, salt=None, first_token=0):
    ids = list(range(first_token, first_token + size * len(hashes)))
    extra = [(salt,) if salt and parent is None and i == 0 else None for i in range(len(hashes))]
    return BlockStored(hashes, parent, ids, size, None, "GPU", lora, extra)


def test_uses_credit_every_block_of_a_chain_and_restores_count():
    holdings = ReplicaHoldings("r", window_s=60)
    holdings.apply(EventBatch(1.0, [stored([1, 2], None)]))
    holdings.apply(EventBatch(15.0, [stored([3], 2, first_token=100)]))  # a later request
    holdings.apply(EventBatch(20.0, [stored([4], 2, first_token=200)]))  # another suffix
    holdings.apply(EventBatch(25.0, [BlockRemoved([4], "GPU")]))
    holdings.apply(EventBatch(72.0, [stored([4], 2, ts=72.0, first_token=200)]))  # back again
    counts = holdings.counts()
    assert dict(counts.dtypes.astype(str)) == {k: v.replace("datetime64[us, UTC]", str(
        counts.dtypes["window_start"])) for k, v in KV_COUNT_DTYPES.items()}  # fmt: skip
    first = counts[counts["window_start"].dt.minute == 0].set_index("item_key")
    assert first.loc[KEY_PREFIX + hash_key(2), "requests"] == 3
    assert first.loc[KEY_PREFIX + hash_key(4), "removed"] == 1
    second = counts[counts["window_start"].dt.minute == 1].set_index("item_key")
    assert second.loc[KEY_PREFIX + hash_key(4), "restored"] == 1
    # candidates: the shared head and the suffix used twice; not the suffix used once
    holdings.apply(EventBatch(73.0, [AllBlocksCleared()]))
    items = {i.key: i for i in restore_candidates(holdings, "m")}
    assert set(items) == {KEY_PREFIX + hash_key(2), KEY_PREFIX + hash_key(4)}
    assert items[KEY_PREFIX + hash_key(2)].token_ids == (0, 1, 2, 3)
    assert items[KEY_PREFIX + hash_key(4)].token_ids == (0, 1, 2, 3, 200, 201)


def test_a_request_published_in_chunks_is_one_use_and_restored_whole():
    # vLLM publishes a long prompt's prefill chunks (and its output's blocks) as separate
    # events, each extending the last block of the one before, moments later
    holdings = ReplicaHoldings("r", window_s=60)
    holdings.apply(EventBatch(1.0, [stored([1, 2], None)]))
    holdings.apply(EventBatch(1.4, [stored([3, 4], 2, first_token=4)]))
    holdings.apply(EventBatch(1.9, [stored([5], 4, first_token=8)]))
    assert holdings.uses_by_window(hash_key(2)) == {0: 1}
    assert holdings.uses_by_window(hash_key(5)) == {0: 1}
    counts = holdings.counts().set_index("item_key")
    assert counts.loc[KEY_PREFIX + hash_key(1), "requests"] == 1
    assert counts.loc[KEY_PREFIX + hash_key(5), "prompt_tokens"] == 10
    assert counts.loc[KEY_PREFIX + hash_key(3), "prompt_tokens"] == 6
    holdings.apply(EventBatch(2.0, [AllBlocksCleared()]))
    (item,) = restore_candidates(holdings, "m")
    assert item.token_ids == tuple(range(10))


def test_take_counts_drains_closed_windows_once():
    holdings = ReplicaHoldings("r", window_s=10)
    holdings.apply(EventBatch(1.0, [stored([1], None)]))
    holdings.apply(EventBatch(15.0, [stored([2], 1)]))
    closed = holdings.take_counts(before_ts=15.0)
    assert set(closed["window_start"].dt.second) == {0}
    assert holdings.take_counts(before_ts=15.0).empty
    assert set(holdings.take_counts()["window_start"].dt.second) == {10}


def test_content_keys_match_the_events_and_verification_needs_the_whole_chain():
    holdings = ReplicaHoldings("r")
    holdings.apply(EventBatch(1.0, [stored([1, 2], None, salt="t", lora="a")]))
    expected = chain_content_keys([0, 1, 2, 3], 2, adapter="a", salt="t")
    assert sorted(expected) == sorted(holdings.held_contents())
    assert chain_content_keys([0, 1, 2, 3], 2, adapter="a", salt="u") != expected
    parents = {hash_key(1): None, hash_key(2): hash_key(1)}
    assert chain_held(parents, hash_key(2))
    assert not chain_held({hash_key(2): hash_key(1)}, hash_key(2))


def test_snapshot_round_trip_keeps_holdings_and_cursor():
    holdings, _ = real_holdings()
    again, cursor = holdings_from_bytes(holdings_to_bytes(holdings, (16, "abc")))
    assert cursor == (16, "abc")
    assert again.held == holdings.held and again.before_reset == holdings.before_reset
    assert again.known == holdings.known
    assert [i.key for i in restore_candidates(again, "m")] == [
        i.key for i in restore_candidates(holdings, "m")
    ]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["s", "r", "c"]), st.integers(0, 6)), max_size=40))
def test_held_is_what_was_stored_and_not_removed_since(ops):
    holdings, model, parent = ReplicaHoldings("r", max_known=5), set(), None
    for op, block in ops:
        if op == "s":
            holdings.apply(EventBatch(0.0, [stored([block], None)]))
            model.add(hash_key(block))
        elif op == "r":
            holdings.apply(EventBatch(0.0, [BlockRemoved([block], "GPU")]))
            model.discard(hash_key(block))
        else:
            holdings.apply(EventBatch(0.0, [AllBlocksCleared()]))
            model.clear()
    assert holdings.held == model and parent is None
    assert set(holdings.held) <= set(holdings.known)
