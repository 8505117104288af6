"""A replica's holdings as bytes (msgpack, msgspec), and back: what a restarted ``prewarm
kv-events`` service resumes from, with the stream cursor the holdings reflect."""

from __future__ import annotations

from collections import Counter

import msgspec

from pipeline.errors import BadInputError
from pipeline.kv_holdings import KvBlock, ReplicaHoldings


class _Snapshot(msgspec.Struct, array_like=True, gc=False):
    replica: str
    window_s: int
    blocks: list[tuple[str, str | None, list[int], str | None, str | None, float, int,
                       str | None]]  # fmt: skip
    held: list[str]
    before_reset: list[str]
    uses: dict[str, dict[int, int]]
    resets: int
    cursor: tuple[int, str] | None = None


def holdings_to_bytes(holdings: ReplicaHoldings, cursor: tuple[int, str] | None = None) -> bytes:
    """A replica's holdings (and the stream position they reflect) as msgpack bytes."""
    blocks = [
        (b.key, b.parent, list(b.token_ids), b.adapter, b.salt, b.stored_at, b.removals, b.content)
        for b in holdings.known.values()
    ]
    uses = {k: dict(v) for k, v in holdings.uses.items()}
    snapshot = _Snapshot(holdings.replica, holdings.window_s, blocks, sorted(holdings.held),
                         sorted(holdings.before_reset), uses, holdings.resets, cursor)  # fmt: skip
    return msgspec.msgpack.encode(snapshot)


def holdings_from_bytes(
    raw: bytes, where: str = "holdings"
) -> tuple[ReplicaHoldings, tuple[int, str] | None]:
    """Inverse of :func:`holdings_to_bytes`; a damaged snapshot is bad input naming ``where``."""
    try:
        snap = msgspec.msgpack.decode(raw, type=_Snapshot)
    except msgspec.DecodeError as exc:
        raise BadInputError(f"not a holdings snapshot ({exc})", where=where) from exc
    holdings = ReplicaHoldings(snap.replica, snap.window_s, resets=snap.resets)
    for key, parent, ids, adapter, salt, ts, removals, content in snap.blocks:
        holdings.known[key] = KvBlock(key, parent, tuple(ids), adapter, salt, ts, removals, content)
    holdings.held = set(snap.held) & set(holdings.known)
    holdings.before_reset = set(snap.before_reset)
    holdings.uses = {k: Counter(v) for k, v in snap.uses.items()}
    return holdings, snap.cursor
