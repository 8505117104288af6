"""vLLM's KV-cache event stream (pure): its wire format, decoded with msgspec.

A vLLM engine started with ``--kv-events-config '{"enable_kv_cache_events": true, "publisher":
"zmq", ...}'`` publishes, per scheduler step, one ZMQ message of three frames::

    [topic, sequence number (8 bytes, big-endian), msgpack payload]

The payload is an ``EventBatch`` encoded as an array ``[ts, events, data_parallel_rank]``. Each
event is a tagged struct of ``vllm/distributed/kv_events.py``: ``BlockStored``, ``BlockRemoved``
or ``AllBlocksCleared``. Two encodings of an event exist:

* **tagged arrays** (vLLM up to mid-2026): ``["BlockStored", block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name, extra_keys, ...]`` — the tag first, then every
  field in declaration order (msgspec's ``omit_defaults`` does not thin an array). The first
  releases had only the five fields up to ``lora_id`` and a ``BlockRemoved`` of ``block_hashes``
  alone; fields were appended since.
* **tagged maps** (vllm PR #42892): ``{"type": "BlockStored", "block_hashes": ..., ...}``, fields at
  their default omitted.

The structs here declare vLLM's fields in vLLM's order; everything after ``block_hashes`` has a
default, so both the oldest arrays and maps that omit defaults decode, and fields a newer vLLM
appends are ignored. Block hashes are 64-bit ints (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, the
default) or sha256 bytes.

The ROUTER replay socket answers a request ``[b"", start_seq]`` with ``[b"", topic, seq,
payload]`` per buffered batch and ends with sequence ``-1`` and an empty payload.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

BlockHash = int | bytes
#: The sequence number the replay socket ends a replay with.
END_OF_REPLAY = -1
MEDIUM_GPU = "GPU"
WireForm = Literal["map", "array"]


class KvCacheEvent(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    """One KV-cache event (tagged-map form; :class:`ArrayBlockStored` & co. are the array form)."""


class BlockStored(KvCacheEvent):
    """Blocks the engine computed and now holds: ``token_ids`` are the tokens of all of them."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None = None
    token_ids: list[int] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    #: One entry per block: the LoRA name (when ``lora_name`` is set), multi-modal
    #: ``(identifier, offset)`` pairs, the cache salt (first block only), prompt-embed digests.
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KvCacheEvent):
    """Blocks the engine evicted."""

    block_hashes: list[BlockHash]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KvCacheEvent):
    """The engine dropped its whole prefix cache (``/reset_prefix_cache``)."""


class ArrayBlockStored(BlockStored, array_like=True, tag="BlockStored"):
    """:class:`BlockStored` as the older vLLM encoded it (a tagged array)."""


class ArrayBlockRemoved(BlockRemoved, array_like=True, tag="BlockRemoved"):
    """:class:`BlockRemoved` as the older vLLM encoded it."""


class ArrayAllBlocksCleared(AllBlocksCleared, array_like=True, tag="AllBlocksCleared"):
    """:class:`AllBlocksCleared` as the older vLLM encoded it."""


AnyEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    """One published batch (one scheduler step of one data-parallel rank)."""

    ts: float
    events: list[AnyEvent]
    data_parallel_rank: int | None = None


class _ArrayBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[ArrayBlockStored | ArrayBlockRemoved | ArrayAllBlocksCleared]
    data_parallel_rank: int | None = None


class _MapBlockStored(msgspec.Struct, tag="BlockStored", gc=False):
    """:class:`BlockStored` as a current vLLM 0.32 puts it on the wire: every field, ``None``
    included (vllm-router 0.1.17 refuses an event without ``parent_block_hash``, ``lora_id`` or
    ``lora_name``)."""

    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class _MapBlockRemoved(msgspec.Struct, tag="BlockRemoved", gc=False):
    """:class:`BlockRemoved` as a current vLLM puts it on the wire: every field."""

    block_hashes: list[BlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class _MapBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_MapBlockStored | _MapBlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


@dataclass(frozen=True, slots=True)
class KvMessage:
    """One decoded ZMQ message: topic, sequence number and its batch."""

    topic: bytes
    seq: int
    batch: EventBatch


def hash_key(block_hash: BlockHash) -> str:
    """A block hash as a stable string: 16 hex digits for an int (as unsigned 64-bit), the
    digest's hex for bytes."""
    if isinstance(block_hash, bytes):
        return block_hash.hex()
    return format(block_hash % (1 << 64), "016x")


def sequence_number(frame: bytes) -> int:
    """The 8-byte big-endian sequence frame as an int (the replay's end marker is -1)."""
    if len(frame) != 8:
        raise ValueError(f"sequence frame of {len(frame)} bytes, not 8")
    return int.from_bytes(frame, "big", signed=True)


def encode_sequence(seq: int) -> bytes:
    """The sequence frame for ``seq`` (as vLLM's publisher writes it)."""
    return seq.to_bytes(8, "big", signed=True)


_MAP_DECODER = msgspec.msgpack.Decoder(EventBatch)
_ARRAY_DECODER = msgspec.msgpack.Decoder(_ArrayBatch)
_RAW_DECODER = msgspec.msgpack.Decoder(_RawBatch)
_EVENT_DECODERS = {
    "map": msgspec.msgpack.Decoder(BlockStored | BlockRemoved | AllBlocksCleared),
    "array": msgspec.msgpack.Decoder(ArrayBlockStored | ArrayBlockRemoved | ArrayAllBlocksCleared),
}


class KvEventDecoder:
    """Decodes payloads of either wire form; what cannot be decoded is counted, never raised.

    A stream keeps one form, so the form that decoded the last batch is tried first (one
    msgspec call per batch). A batch neither form decodes whole is decoded event by event: the
    good events are kept and each bad one is counted (``rejects['event']``).
    """

    def __init__(self) -> None:
        self.form: WireForm = "map"
        self.rejects: Counter[str] = Counter()

    def decode_payload(self, payload: bytes) -> EventBatch | None:
        """The batch in ``payload``, or None (counted in ``rejects``) when it is not one."""
        first, second = ("map", "array") if self.form == "map" else ("array", "map")
        for form in (first, second):
            try:
                batch = (_MAP_DECODER if form == "map" else _ARRAY_DECODER).decode(payload)
            except msgspec.DecodeError:
                continue
            self.form = "map" if form == "map" else "array"
            return batch  # type: ignore[return-value]  # the array structs subclass the map ones
        return self._salvage(payload)

    def _salvage(self, payload: bytes) -> EventBatch | None:
        try:
            raw = _RAW_DECODER.decode(payload)
        except msgspec.DecodeError:
            self.rejects["payload"] += 1
            return None
        events = [e for e in (self._event(r) for r in raw.events) if e is not None]
        return EventBatch(raw.ts, events, raw.data_parallel_rank)

    def _event(self, raw: msgspec.Raw) -> AnyEvent | None:
        for form in ("map", "array"):
            try:
                return _EVENT_DECODERS[form].decode(raw)
            except msgspec.DecodeError:
                continue
        self.rejects["event"] += 1
        return None

    def decode_frames(self, frames: Sequence[bytes]) -> KvMessage | None:
        """A PUB message ``[topic, seq, payload]`` decoded, or None (counted) when malformed."""
        if len(frames) != 3:
            self.rejects["frames"] += 1
            return None
        topic, seq_frame, payload = frames
        try:
            seq = sequence_number(seq_frame)
        except ValueError:
            self.rejects["sequence"] += 1
            return None
        batch = self.decode_payload(payload)
        return None if batch is None else KvMessage(topic, seq, batch)


def encode_batch(batch: EventBatch, form: WireForm = "map") -> bytes:
    """``batch`` encoded as vLLM encodes it, in the tagged-map or the older tagged-array form."""
    if form == "map":
        maps = [_as_map(e) for e in batch.events]
        return msgspec.msgpack.encode(_MapBatch(batch.ts, maps, batch.data_parallel_rank))
    events = [_as_array(e) for e in batch.events]
    return msgspec.msgpack.encode(_ArrayBatch(batch.ts, events, batch.data_parallel_rank))


def _as_map(event: AnyEvent) -> _MapBlockStored | _MapBlockRemoved | AllBlocksCleared:
    if isinstance(event, AllBlocksCleared):
        return event
    fields = {f: getattr(event, f) for f in event.__struct_fields__}
    if isinstance(event, BlockStored):
        return _MapBlockStored(**fields)
    return _MapBlockRemoved(**fields)


def _as_array(event: AnyEvent) -> ArrayBlockStored | ArrayBlockRemoved | ArrayAllBlocksCleared:
    kind = {BlockStored: ArrayBlockStored, BlockRemoved: ArrayBlockRemoved}
    cls = next((k for base, k in kind.items() if isinstance(event, base)), ArrayAllBlocksCleared)
    fields = {f: getattr(event, f) for f in event.__struct_fields__}
    return cls(**fields)
