"""Prefixes as a tree (pure): shared heads of the records' prompts, nested ones as one chain.

Each prompt is cut into pseudo-token blocks with chain hashes (:mod:`pipeline.prefix_blocks`); all
chains of one (model, tenant, endpoint) form a trie. A node is a *shared prefix* when at least
``min_count`` requests pass through it and they diverge (or end) there — a system prompt, a
template's static head, a repeated question under that head. Shared prefixes on one chain are
nested: each names the nearest shorter one as its ``parent``, so the planner can prime the
longest one worth its cost and credit its ancestors (priming a prefix warms every block of its
ancestors) instead of priming them again. ``count`` is the number of requests that pass through
a prefix, so a parent's count includes its children's.

A prefix's text is the longest common prefix of the prompts that pass through it, so it ends
where they diverge, not at a block boundary of the detector (the engine's blocks are its own).

Seen once: a request whose chain holds no shared prefix long enough to be cached
(``min_tokens``) — a template seen once, or one behind a short header shared by everything — is
a prefix of its own (its whole prompt, what a replay would send), so a cache with room can hold
it; the forecast ranks it below what was seen more often.

Chat traffic: where records carry their ``messages`` (an optional column beyond the record
contract), the leading system messages are the prefix and the item keeps them, so priming goes
through ``/v1/chat/completions`` and the engine's own chat template renders them. A chat prompt
known only as the text the engine rendered (vLLM's log) is primed as that text through
``/v1/completions`` with ``add_special_tokens=False`` (the rendered text already holds the
template's BOS), which gives the engine the same tokens a chat request of that user gets.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from pipeline.keys import canonical_json, stable_hash
from pipeline.planner.plan import WarmItem
from pipeline.planner.recency import weigh_windows
from pipeline.prefix_blocks import DEFAULT_BLOCK_SIZE, count_tokens, prefix_chain

GroupKey = tuple[str, str, str]  # model, tenant, endpoint


@dataclass
class SharedPrefix:
    """A detected prefix: identity, text or messages, size, requests through it per window."""

    key: str
    model: str
    tenant: str
    endpoint: str
    tokens: int
    text: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    count: int = 0
    windows: Counter[int] = field(default_factory=Counter)
    last_ts: float = 0.0
    profiles: Counter[str] = field(default_factory=Counter)
    parent: str | None = None

    @property
    def profile(self) -> str | None:
        """The workload profile most of its requests belong to (records' ``profile`` column)."""
        return self.profiles.most_common(1)[0][0] if self.profiles else None


@dataclass
class _Node:
    count: int = 0
    children: Counter[str] = field(default_factory=Counter)


def _group(row: Mapping[str, Any]) -> GroupKey:
    # "chat" as written by tests and traces, "/v1/chat/completions" as vLLM's logs name it
    endpoint = "chat" if "chat" in str(row.get("endpoint") or "") else "completions"
    return (present(row.get("model")) or "unknown", present(row.get("tenant")) or "default",
            endpoint)  # fmt: skip


def present(value: Any) -> str | None:
    """``value`` as text, or None when it is missing (None, NA, NaN, NaT) or empty."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, float) and value != value:
        return None
    text = str(value)
    return text or None


def _window(ts: Any, window_s: int) -> tuple[int, float]:
    seconds = pd.Timestamp(ts).timestamp() if present(ts) is not None else 0.0
    return int(seconds // window_s), seconds


def _chains(
    rows: list[dict[str, Any]], block_size: int
) -> tuple[dict[tuple[GroupKey, str], _Node], list[tuple[GroupKey, list[tuple[str, int]]]]]:
    """Trie nodes by (group, chain hash) and each row's chain as (hash, tokens) pairs."""
    nodes: dict[tuple[GroupKey, str], _Node] = defaultdict(_Node)
    chains: list[tuple[GroupKey, list[tuple[str, int]]]] = []
    for row in rows:
        group, blocks = _group(row), prefix_chain(row["prompt"], block_size)
        for i, block in enumerate(blocks):
            node = nodes[(group, block.hash)]
            node.count += 1
            if i + 1 < len(blocks):
                node.children[blocks[i + 1].hash] += 1
        chains.append((group, [(b.hash, b.tokens) for b in blocks]))
    return nodes, chains


def common_head(a: str, b: str) -> str:
    """The longest common prefix of two texts (a binary search over slice comparisons)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return a[:low]


def _is_shared(node: _Node, min_count: int) -> bool:
    widest_child = max(node.children.values(), default=0)
    return node.count >= min_count and widest_child < node.count


def _prefixes_of(
    chain: list[tuple[str, int]], group: GroupKey, nodes: Mapping[tuple[GroupKey, str], _Node],
    min_count: int, min_tokens: int,
) -> list[tuple[str, int]]:  # fmt: skip
    """The shared prefixes on one chain, shortest first; the whole chain when none of them is
    long enough to be cached (a prompt seen once is then its own prefix)."""
    shared = [(h, t) for h, t in chain if _is_shared(nodes[(group, h)], min_count)]
    if chain and not any(t >= min_tokens for _, t in shared) and chain[-1] not in shared:
        shared.append(chain[-1])
    return shared


def detect_text_prefixes(
    records: pd.DataFrame,
    *,
    min_count: int = 2,
    block_size: int = DEFAULT_BLOCK_SIZE,
    window_s: int = 300,
    min_tokens: int = 0,
) -> list[SharedPrefix]:
    """The prefix tree of the prompts in ``records``; records without a prompt are skipped.

    ``min_tokens`` (estimated tokens) is the shortest prefix an engine can cache: a request
    whose shared prefixes are all shorter counts as a prefix of its own.
    """
    rows = [r for r in records.to_dict("records") if present(r.get("prompt"))]
    nodes, chains = _chains(rows, block_size)
    found: dict[tuple[GroupKey, str], SharedPrefix] = {}
    for row, (group, chain) in zip(rows, chains, strict=True):
        parent: str | None = None
        for key, tokens in _prefixes_of(chain, group, nodes, min_count, min_tokens):
            prefix = found.get((group, key))
            if prefix is None:
                prefix = SharedPrefix(key, *group, tokens, text=row["prompt"], parent=parent)
                found[(group, key)] = prefix
            else:  # where the prompts through it diverge, at the character
                prefix.text = common_head(prefix.text or "", row["prompt"])
            _credit(prefix, row.get("ts"), window_s, row.get("profile"))
            parent = key
    for prefix in found.values():
        prefix.tokens = max(prefix.tokens, count_tokens(prefix.text or ""))
    return sorted(found.values(), key=lambda p: (-p.count, p.key))


def _credit(prefix: SharedPrefix, ts: Any, window_s: int, profile: Any = None) -> None:
    window, seconds = _window(ts, window_s)
    if present(profile):
        prefix.profiles[str(profile)] += 1
    prefix.count += 1
    prefix.windows[window] += 1
    prefix.last_ts = max(prefix.last_ts, seconds)


def _system_messages(raw: Any) -> tuple[dict[str, str], ...]:
    messages = json.loads(raw) if isinstance(raw, str | bytes) else list(raw or ())
    lead: list[dict[str, str]] = []
    for message in messages:
        if message.get("role") != "system":
            break
        lead.append({"role": "system", "content": str(message.get("content", ""))})
    return tuple(lead)


def detect_chat_prefixes(
    records: pd.DataFrame, *, min_count: int = 2, window_s: int = 300
) -> list[SharedPrefix]:
    """Shared leading system messages of chat records that carry a ``messages`` column."""
    if "messages" not in records.columns:
        return []
    found: dict[tuple[GroupKey, str], SharedPrefix] = {}
    for row in records.to_dict("records"):
        if present(row.get("messages")) is None and not isinstance(row.get("messages"), list):
            continue
        lead = _system_messages(row["messages"])
        if not lead:
            continue
        group = (*_group(row)[:2], "chat")
        key = "m" + stable_hash(canonical_json(list(lead)))
        tokens = sum(count_tokens(m["content"]) for m in lead)
        prefix = found.setdefault((group, key), SharedPrefix(key, *group, tokens, messages=lead))
        _credit(prefix, row.get("ts"), window_s, row.get("profile"))
    return sorted((p for p in found.values() if p.count >= min_count), key=lambda p: -p.count)


def detect_prefixes(
    records: pd.DataFrame, *, min_count: int = 2, block_size: int = DEFAULT_BLOCK_SIZE,
    window_s: int = 300, min_tokens: int = 0,
) -> list[SharedPrefix]:  # fmt: skip
    """Chat prefixes from messages where known, the text prefix tree of every other prompt."""
    has_messages = (
        records["messages"].notna()
        if "messages" in records.columns
        else pd.Series(False, index=records.index)
    )
    chat = detect_chat_prefixes(records[has_messages], min_count=min_count, window_s=window_s)
    text = detect_text_prefixes(
        records[~has_messages], min_count=min_count, block_size=block_size, window_s=window_s,
        min_tokens=min_tokens,
    )  # fmt: skip
    return chat + text


#: how candidates detect the records' prefixes (:func:`detect_prefixes` or a :class:`DetectedOnce`)
Detect = Callable[..., list[SharedPrefix]]


class DetectedOnce:
    """:func:`detect_prefixes` of one records frame, detected once per set of parameters: the
    plans that share one frame (the window's plans of a spread fleet's replicas, made from the
    fleet's combined records) share its detection. Any other frame is detected as usual."""

    def __init__(self, records: pd.DataFrame) -> None:
        self.records = records
        self._found: dict[tuple[tuple[str, Any], ...], list[SharedPrefix]] = {}

    def __call__(self, records: pd.DataFrame, **params: Any) -> list[SharedPrefix]:
        if records is not self.records:  # a frame of its own (a copy with profiles, say)
            return detect_prefixes(records, **params)
        key = tuple(sorted(params.items()))
        if key not in self._found:
            self._found[key] = detect_prefixes(records, **params)
        return list(self._found[key])


Span = tuple[int, int]  # first and last window of the history


def _span(windows: Mapping[int, float], span: Span | None) -> Span:
    if span is None:
        return min(windows), max(windows)
    return min(span[0], min(windows)), max(span[1], max(windows))


#: The frequency estimate's EWMA weight on the latest window.
FREQUENCY_ALPHA = 0.5


def frequency_forecast(
    windows: Mapping[int, float], alpha: float = FREQUENCY_ALPHA, span: Span | None = None
) -> float:
    """Next-window hits from per-window counts: EWMA over the history's windows (``span``, by
    default the item's own), gaps counted as 0."""
    if not windows:
        return 0.0
    first, last = _span(windows, span)
    estimate = 0.0
    for window in range(first, last + 1):
        estimate = alpha * windows.get(window, 0) + (1 - alpha) * estimate
    return estimate


def history_rate(windows: Mapping[int, float], span: Span | None = None) -> float:
    """Mean hits per window over the history (``span``, by default the item's own), gaps 0."""
    if not windows:
        return 0.0
    first, last = _span(windows, span)
    return sum(windows.values()) / (last - first + 1)


def frequency_hits(
    windows: Mapping[int, float], alpha: float = FREQUENCY_ALPHA, span: Span | None = None
) -> float:
    """Next-window hits: the EWMA (recent trend) averaged with the whole-history rate.

    The EWMA alone gives ``alpha·c`` for a single window of ``c`` requests and discounts a
    prefix seen a few times earlier towards 0; the history rate keeps every prefix seen
    predicted above 0 (its expected reuse), the EWMA still ranks recent ones higher. With the
    history's ``span``, every item is measured over the same windows, so one seen twice long
    ago is not ranked above one seen twice lately. The backtest scores the same estimate as the
    model ``frequency`` (``models.baselines.FrequencyEstimate``).
    """
    return 0.5 * frequency_forecast(windows, alpha, span) + 0.5 * history_rate(windows, span)


#: A learned forecast's prediction is floored at this share of the prefix's history rate.
SEEN_FLOOR_SHARE = 0.1


def prefix_items(
    prefixes: Iterable[SharedPrefix],
    forecast: Mapping[str, float] | None = None,
    window_s: int = 300,
    span: Span | None = None,
    newest_from: int | None = None,
) -> list[WarmItem]:
    """Warm-up candidates for prefixes; hits from ``forecast`` or :func:`frequency_hits`.

    A prefix seen in the history is never predicted at exactly 0: a learned forecast's value is
    floored at :data:`SEEN_FLOOR_SHARE` of its history rate. Each item names its ``parent``.
    With ``newest_from`` (a window number, after a drift), windows before it weigh less
    (:mod:`pipeline.planner.recency`).
    """
    items = []
    for p in prefixes:
        windows = weigh_windows(p.windows, newest_from)
        if forecast is not None and p.key in forecast:
            hits = max(forecast[p.key], SEEN_FLOOR_SHARE * history_rate(windows, span))
        else:
            hits = frequency_hits(windows, span=span)
        params: dict[str, Any] = {}
        if p.endpoint == "chat" and p.messages is None:
            params["add_special_tokens"] = False
        items.append(
            WarmItem(
                kind="prefix",
                key=p.key,
                model=p.model,
                tenant=p.tenant,
                tokens=p.tokens,
                text=p.text,
                messages=p.messages,
                endpoint="chat" if p.messages is not None else "completions",
                predicted_hits=hits,
                params=params,
                profile=p.profile,
                next_use_s=window_s / hits if hits > 0 else None,
                parent=p.parent,
            )
        )
    return items
