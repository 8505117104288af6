"""What a replica holds, learned from its KV-cache events alone (pure).

Per replica, :class:`ReplicaHoldings` applies decoded batches (:mod:`pipeline.kv_events`) and
keeps:

* the blocks it **holds now** — hash, parent, token ids, adapter, cache salt, when stored;
* the blocks it **knew** (held now or before; bounded), so an evicted block's tokens still
  rebuild a chain and a block stored again after its eviction is a *re-store*;
* per window, for every block chain (named by its last block), how often it was **used** (a
  ``BlockStored`` event extending it: the request read every block before the new ones from the
  cache and computed the rest), **stored**, **re-stored after eviction** and **removed** — the
  loop's item × window counts shape (:mod:`pipeline.windows`), items ``kv:<block hash>``.

What events cannot say: a request whose prompt was cached up to its last partial block
publishes nothing, so uses undercount hits on a head that nobody extends by a whole block.

A restart (the subscriber sees the sequence go back) or ``AllBlocksCleared`` moves what was held
into :attr:`ReplicaHoldings.before_reset`; :func:`restore_candidates` turns it into warm-up items
primed with their exact token ids.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from pipeline.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    hash_key,
)
from pipeline.planner.plan import WarmItem
from pipeline.shared_prefixes import frequency_hits
from pipeline.windows import COUNT_DTYPES

#: Blocks remembered per replica beyond those held (for chains and re-stores); ~1 KiB each.
DEFAULT_MAX_KNOWN = 200_000
#: An event extending the last block of an event stored this recently (seconds) continues the
#: same request (chunked prefill, decode filling a block): not another use of what it extends.
CONTINUATION_S = 10.0
#: Last blocks of recent events remembered to recognise continuations.
MAX_OPEN_LEAVES = 10_000
#: Item keys of chains learned from KV events (never equal to a text prefix's key).
KEY_PREFIX = "kv:"
KV_COUNT_DTYPES = {**COUNT_DTYPES, "stored": "int64", "restored": "int64", "removed": "int64"}


@dataclass(slots=True)
class KvBlock:
    """One block as its ``BlockStored`` event described it; ``content`` names the prefix ending
    here by its tokens, adapter and salt (:func:`content_key`; None when an ancestor is unknown)."""

    key: str
    parent: str | None
    token_ids: tuple[int, ...]
    adapter: str | None
    salt: str | None
    stored_at: float
    removals: int = 0
    content: str | None = None


def content_key(
    parent: str | None, token_ids: Iterable[int], adapter: str | None, salt: str | None
) -> str:
    """A block named by what it holds: its parent's content key (``None`` at a chain's root),
    its tokens, its adapter and (at the root) the cache salt. Unlike an engine's block hash it
    is the same across engine restarts and versions, so a primed prefix can be recognised in
    the new engine's events."""
    head = f"{parent or ''}|{adapter or ''}|{salt or '' if parent is None else ''}|"
    payload = head.encode() + ",".join(map(str, token_ids)).encode()
    return hashlib.blake2b(payload, digest_size=8).hexdigest()


def chain_content_keys(
    token_ids: Sequence[int], block_size: int, adapter: str | None = None, salt: str | None = None
) -> list[str]:
    """Content keys of the whole blocks of a prefix given as token ids."""
    keys: list[str] = []
    parent: str | None = None
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = content_key(parent, token_ids[start : start + block_size], adapter, salt)
        keys.append(parent)
    return keys


@dataclass(slots=True)
class _Tally:
    used: int = 0
    stored: int = 0
    restored: int = 0
    removed: int = 0
    tokens: int = 0


def _salt(extra: tuple[object, ...] | None, lora_name: str | None) -> str | None:
    """The cache salt in a first block's extra keys: its string after the LoRA name."""
    strings = [k for k in (extra or ()) if isinstance(k, str)]
    if lora_name is not None and strings and strings[0] == lora_name:
        strings = strings[1:]
    return strings[-1] if strings else None


def _split(event: BlockStored) -> list[tuple[int, ...]] | None:
    """The event's token ids per block, or None when they do not add up."""
    n, ids, size = len(event.block_hashes), event.token_ids, event.block_size
    if n == 1:
        return [tuple(ids)]
    if size <= 0 or len(ids) != n * size:
        return None
    return [tuple(ids[i * size : (i + 1) * size]) for i in range(n)]


@dataclass
class ReplicaHoldings:
    """The blocks one replica holds, and what its events said per window."""

    replica: str
    window_s: int = 300
    max_known: int = DEFAULT_MAX_KNOWN
    held: set[str] = field(default_factory=set)
    known: OrderedDict[str, KvBlock] = field(default_factory=OrderedDict)
    before_reset: set[str] = field(default_factory=set)
    tallies: dict[tuple[int, str], _Tally] = field(default_factory=dict)
    uses: dict[str, Counter[int]] = field(default_factory=dict)
    ignored: Counter[str] = field(default_factory=Counter)
    resets: int = 0
    #: content key -> held (True) or not (False) since the last :meth:`take_changes`
    changes: dict[str, bool] = field(default_factory=dict)
    cleared: bool = False
    #: blocks the last reset took away (0: the replica held nothing it did not lose before)
    lost_at_reset: int = 0
    block_size: int | None = None
    #: last block of each recent ``BlockStored`` event not yet extended -> when it was stored
    open_leaves: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def apply(self, batch: EventBatch) -> None:
        """Apply one batch's events in order."""
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._stored(event, batch.ts)
            elif isinstance(event, BlockRemoved):
                self._removed(event, batch.ts)
            elif isinstance(event, AllBlocksCleared):
                self.reset()

    def _tally(self, ts: float, key: str) -> _Tally:
        window = int(ts // self.window_s) * self.window_s
        tally = self.tallies.get((window, key))
        if tally is None:
            tally = self.tallies[(window, key)] = _Tally()
        return tally

    def _device(self, medium: str | None, group_idx: int | None) -> bool:
        """Only the engine's own cache (medium GPU, also on CPU builds) of its first group."""
        if medium not in (None, MEDIUM_GPU):
            self.ignored["medium"] += 1
            return False
        if group_idx not in (None, 0):
            self.ignored["group"] += 1
            return False
        return True

    def _stored(self, event: BlockStored, ts: float) -> None:
        if not self._device(event.medium, event.group_idx):
            return
        tokens = _split(event)
        if tokens is None:
            self.ignored["token_count"] += 1
            return
        self.block_size = event.block_size or self.block_size
        parent = None if event.parent_block_hash is None else hash_key(event.parent_block_hash)
        extra = event.extra_keys or []
        last = parent
        for i, (raw, ids) in enumerate(zip(event.block_hashes, tokens, strict=True)):
            key = hash_key(raw)
            salt = self._inherited_salt(last, extra[i] if i < len(extra) else None, event)
            previous = self.known.get(key)
            tally = self._tally(ts, key)
            tally.stored += 1
            if previous is not None and previous.removals and key not in self.held:
                tally.restored += 1
            removals = previous.removals if previous is not None else 0
            content = self._content(last, ids, event.lora_name, salt)
            self._remember(KvBlock(key, last, ids, event.lora_name, salt, ts, removals, content))
            self.held.add(key)
            if content is not None:
                self.changes[content] = True
            last = key
        if last is not None:
            self._count_use(last, ts, until=parent if self._continues(parent, ts) else None)
            self._open(last, ts)

    def _continues(self, parent: str | None, ts: float) -> bool:
        """Whether an event extending ``parent`` continues the request that stored it: vLLM
        publishes a long prompt's chunks (and its output's blocks) as separate events, each
        extending the last block of the one before, moments later."""
        stored = self.open_leaves.pop(parent, None) if parent is not None else None
        return stored is not None and ts - stored <= CONTINUATION_S

    def _open(self, leaf: str, ts: float) -> None:
        self.open_leaves[leaf] = ts
        self.open_leaves.move_to_end(leaf)
        while len(self.open_leaves) > MAX_OPEN_LEAVES:
            self.open_leaves.popitem(last=False)

    def _inherited_salt(
        self, parent: str | None, extra: tuple[object, ...] | None, event: BlockStored
    ) -> str | None:
        if parent is None:
            return _salt(extra, event.lora_name)
        block = self.known.get(parent)
        return block.salt if block is not None else None

    def _content(
        self, parent: str | None, ids: tuple[int, ...], adapter: str | None, salt: str | None
    ) -> str | None:
        if parent is None:
            return content_key(None, ids, adapter, salt)
        block = self.known.get(parent)
        if block is None or block.content is None:
            return None
        return content_key(block.content, ids, adapter, salt)

    def _remember(self, block: KvBlock) -> None:
        self.known[block.key] = block
        self.known.move_to_end(block.key)
        while len(self.known) > self.max_known:
            # the least recently stored block not held now; held blocks are never forgotten, nor
            # the block being stored (its caller marks it held after remembering it)
            victim = next((k for k in self.known if k not in self.held and k != block.key), None)
            if victim is None:
                break
            del self.known[victim]
            self.uses.pop(victim, None)

    def _count_use(self, leaf: str, ts: float, until: str | None = None) -> None:
        """One use of the chain ending at ``leaf``: every block on it, root included, or only
        those below ``until`` (a continuation: the blocks above were counted with its start)."""
        chain = self.chain(leaf)
        depth_tokens = sum(len(self.known[key].token_ids) for key in chain)
        if until is not None and until in chain:
            chain = chain[: chain.index(until)]
        for key in chain:
            tally = self._tally(ts, key)
            tally.used += 1
            tally.tokens += depth_tokens
            self.uses.setdefault(key, Counter())[int(ts // self.window_s)] += 1
            depth_tokens -= len(self.known[key].token_ids)

    def _removed(self, event: BlockRemoved, ts: float) -> None:
        if not self._device(event.medium, event.group_idx):
            return
        for raw in event.block_hashes:
            key = hash_key(raw)
            self.held.discard(key)
            block = self.known.get(key)
            if block is not None:
                block.removals += 1
                if block.content is not None:
                    self.changes[block.content] = False
            self._tally(ts, key).removed += 1

    def reset(self) -> None:
        """The replica lost its cache (restart or ``AllBlocksCleared``): keep what it held."""
        self.lost_at_reset = len(self.held)
        if self.held:
            self.before_reset = set(self.held)
        self.held.clear()
        self.resets += 1
        self.changes.clear()
        self.cleared = True

    def take_changes(self) -> tuple[bool, list[str], list[str]]:
        """(cleared, content keys now held, content keys no longer held) since the last call."""
        cleared, changes = self.cleared, self.changes
        self.cleared, self.changes = False, {}
        held = [k for k, v in changes.items() if v]
        return cleared, held, [k for k, v in changes.items() if not v]

    def held_contents(self) -> list[str]:
        """Content keys of every block held now (those whose whole chain is known)."""
        blocks = (self.known.get(k) for k in self.held)
        return [b.content for b in blocks if b is not None and b.content is not None]

    def chain(self, key: str) -> list[str]:
        """Keys from ``key`` up to its root (``key`` first); stops where a block is unknown."""
        out: list[str] = []
        current: str | None = key
        while current is not None and current in self.known and len(out) <= len(self.known):
            out.append(current)
            current = self.known[current].parent
        return out

    def token_ids(self, key: str) -> tuple[int, ...] | None:
        """The tokens of the whole prefix ending at ``key``; None when a block of it is unknown."""
        chain = self.chain(key)
        if not chain or self.known[chain[-1]].parent is not None:
            return None
        return tuple(t for k in reversed(chain) for t in self.known[k].token_ids)

    def counts(self) -> pd.DataFrame:
        """The per-window tallies in the counts shape (plus ``stored``/``restored``/``removed``)."""
        return _counts_frame(self.tallies)

    def take_counts(self, before_ts: float | None = None) -> pd.DataFrame:
        """:meth:`counts` of the windows that started before ``before_ts`` (all when None),
        removed from the tallies, so each window is written out once."""
        cut = math.inf if before_ts is None else int(before_ts // self.window_s) * self.window_s
        taken = {k: v for k, v in self.tallies.items() if k[0] < cut}
        for k in taken:
            del self.tallies[k]
        return _counts_frame(taken)

    def uses_by_window(self, key: str) -> dict[int, int]:
        """Uses of the chain ending at ``key`` per window index (``window_start // window_s``)."""
        return dict(self.uses.get(key, {}))


def _counts_frame(tallies: Mapping[tuple[int, str], _Tally]) -> pd.DataFrame:
    rows = [
        ("prefix", KEY_PREFIX + key, pd.Timestamp(window, unit="s", tz="UTC"), t.used, t.tokens,
         0, t.stored, t.restored, t.removed)
        for (window, key), t in sorted(tallies.items())
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=list(KV_COUNT_DTYPES)).astype(KV_COUNT_DTYPES)


def _children(keys: set[str], known: Mapping[str, KvBlock]) -> dict[str, list[str]]:
    children: dict[str, list[str]] = {k: [] for k in keys}
    for key in keys:
        parent = known[key].parent
        if parent in children:
            children[parent].append(key)
    return children


def shared_heads(
    holdings: ReplicaHoldings, keys: Iterable[str], min_uses: int = 2
) -> dict[str, dict[int, int]]:
    """The chains worth priming among ``keys``, with their uses per window.

    A block is a *shared head* when at least ``min_uses`` uses passed through it and they
    diverge (or end) there. Every leaf of ``keys`` is credited to the deepest shared head on
    its chain, or to itself when it has none (what was held is restored, hot or not), so
    nested chains never count the same use twice.
    """
    targets = {k for k in keys if k in holdings.known}
    children = _children(targets, holdings.known)
    total = {k: sum(holdings.uses_by_window(k).values()) for k in targets}

    def shared(key: str) -> bool:
        widest = max((total[c] for c in children[key]), default=0)
        return total[key] >= min_uses and widest < total[key]

    heads: dict[str, dict[int, int]] = {}
    for leaf in (k for k in targets if not children[k]):
        chain = [k for k in holdings.chain(leaf) if k in targets]
        head = next((k for k in chain if shared(k)), leaf)
        heads.setdefault(head, holdings.uses_by_window(head))
    return heads


def restore_candidates(
    holdings: ReplicaHoldings,
    model: str,
    keys: Iterable[str] | None = None,
    min_uses: int = 2,
    forecast: Mapping[str, float] | None = None,
) -> list[WarmItem]:
    """Warm-up candidates for the chains a replica held (``keys``; default: what it held before
    its last reset, else what it holds now), each primed with its exact token ids.

    Predicted hits come from ``forecast`` (item key → next-window hits) where it has the item,
    else from the frequency estimate of the chain's uses; a chain that was held but never seen
    used (stored before the subscriber joined) counts one use.
    """
    chosen = set(keys) if keys is not None else (holdings.before_reset or holdings.held)
    items = []
    for head, windows in sorted(shared_heads(holdings, chosen, min_uses).items()):
        ids = holdings.token_ids(head)
        if not ids:
            holdings.ignored["unknown_chain"] += 1
            continue
        key = KEY_PREFIX + head
        hits = forecast[key] if forecast and key in forecast else frequency_hits(windows or {0: 1})
        items.append(_item(holdings, head, key, model, ids, hits))
    return items


def _item(
    holdings: ReplicaHoldings, head: str, key: str, model: str, ids: tuple[int, ...], hits: float
) -> WarmItem:
    block = holdings.known[head]
    salt = holdings.known[holdings.chain(head)[-1]].salt
    return WarmItem(
        kind="prefix", key=key, model=model, text="", token_ids=ids, tokens=len(ids),
        tenant=salt or "default", adapter=block.adapter, predicted_hits=hits,
        params={"cache_salt": salt} if salt else {},
        next_use_s=holdings.window_s / hits if hits > 0 else None,
    )  # fmt: skip


def chain_held(parents: Mapping[str, str | None], key: str) -> bool:
    """Whether the chain ending at block ``key`` is held whole: ``parents`` maps each held block
    to its parent (None at a root)."""
    current: str | None = key
    seen = 0
    while current is not None:
        if current not in parents or seen > len(parents):
            return False
        current, seen = parents[current], seen + 1
    return True
