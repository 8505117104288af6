"""Shared-prefix detection from request records (pure), and a frequency forecast.

Each prompt is cut into pseudo-token blocks with chain hashes (:mod:`pipeline.prefix`); all
chains of one (model, tenant, endpoint) form a trie. A node is a *shared prefix* worth warming
when at least ``min_count`` requests pass through it and they diverge (or end) there — a system
prompt, a template's static head. Every request is credited to the deepest shared prefix on its
chain, so nested prefixes do not count the same request twice. The prefix text is the prompt
cut at the block boundary (``PrefixBlock.end``).

Chat traffic: where records carry their ``messages`` (an optional column beyond the record
contract), the leading system messages are the prefix and the item keeps them, so priming goes
through ``/v1/chat/completions`` and the engine's own chat template renders them. A chat prompt
known only as rendered text is primed through ``/v1/completions`` with
``add_special_tokens=False`` (the rendered text already holds the template's BOS).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from pipeline.keys import canonical_json, stable_hash
from pipeline.plan import WarmItem
from pipeline.prefix import DEFAULT_BLOCK_SIZE, count_tokens, prefix_chain

GroupKey = tuple[str, str, str]  # model, tenant, endpoint


@dataclass
class SharedPrefix:
    """A detected shared prefix: identity, text or messages, size and counts per window."""

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

    @property
    def profile(self) -> str | None:
        """The workload profile most of its requests belong to (records' ``profile`` column)."""
        return self.profiles.most_common(1)[0][0] if self.profiles else None


@dataclass
class _Node:
    count: int = 0
    tokens: int = 0
    text: str = ""
    children: Counter[str] = field(default_factory=Counter)


def _group(row: Mapping[str, Any]) -> GroupKey:
    # "chat" as written by tests and traces, "/v1/chat/completions" as vLLM's logs name it
    endpoint = "chat" if "chat" in str(row.get("endpoint") or "") else "completions"
    return (_text(row.get("model")) or "unknown", _text(row.get("tenant")) or "default", endpoint)


def _text(value: Any) -> str | None:
    return None if value is None or value is pd.NA or value != value else str(value)


def _window(ts: Any, window_s: int) -> tuple[int, float]:
    seconds = pd.Timestamp(ts).timestamp() if ts is not None and ts is not pd.NA else 0.0
    return int(seconds // window_s), seconds


def _chains(
    rows: list[dict[str, Any]], block_size: int
) -> tuple[dict[tuple[GroupKey, str], _Node], list[tuple[GroupKey, list[str]]]]:
    nodes: dict[tuple[GroupKey, str], _Node] = defaultdict(_Node)
    chains: list[tuple[GroupKey, list[str]]] = []
    for row in rows:
        group, blocks = _group(row), prefix_chain(row["prompt"], block_size)
        for i, block in enumerate(blocks):
            node = nodes[(group, block.hash)]
            node.count += 1
            if not node.text:
                node.tokens, node.text = block.tokens, row["prompt"][: block.end]
            if i + 1 < len(blocks):
                node.children[blocks[i + 1].hash] += 1
        chains.append((group, [b.hash for b in blocks]))
    return nodes, chains


def _is_shared(node: _Node, min_count: int) -> bool:
    widest_child = max(node.children.values(), default=0)
    return node.count >= min_count and widest_child < node.count


def detect_text_prefixes(
    records: pd.DataFrame,
    *,
    min_count: int = 2,
    block_size: int = DEFAULT_BLOCK_SIZE,
    window_s: int = 300,
) -> list[SharedPrefix]:
    """Shared prefixes of the prompts in ``records``; records without a prompt are skipped."""
    rows = [r for r in records.to_dict("records") if _text(r.get("prompt"))]
    nodes, chains = _chains(rows, block_size)
    found: dict[tuple[GroupKey, str], SharedPrefix] = {}
    for row, (group, chain) in zip(rows, chains, strict=True):
        deepest = next(
            (h for h in reversed(chain) if _is_shared(nodes[(group, h)], min_count)), None
        )
        if deepest is None:
            continue
        prefix = found.get((group, deepest))
        if prefix is None:
            node = nodes[(group, deepest)]
            prefix = SharedPrefix(deepest, *group, node.tokens, text=node.text)
            found[(group, deepest)] = prefix
        _credit(prefix, row.get("ts"), window_s, row.get("profile"))
    return sorted(found.values(), key=lambda p: (-p.count, p.key))


def _credit(prefix: SharedPrefix, ts: Any, window_s: int, profile: Any = None) -> None:
    window, seconds = _window(ts, window_s)
    if _text(profile):
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
        if _text(row.get("messages")) is None and not isinstance(row.get("messages"), list):
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
    window_s: int = 300,
) -> list[SharedPrefix]:  # fmt: skip
    """Chat prefixes from messages where known, text prefixes from every other prompt."""
    has_messages = (
        records["messages"].notna()
        if "messages" in records.columns
        else pd.Series(False, index=records.index)
    )
    chat = detect_chat_prefixes(records[has_messages], min_count=min_count, window_s=window_s)
    text = detect_text_prefixes(
        records[~has_messages], min_count=min_count, block_size=block_size, window_s=window_s
    )
    return chat + text


def frequency_forecast(windows: Mapping[int, int], alpha: float = 0.5) -> float:
    """Next-window hits from per-window counts: EWMA over the windows seen, gaps counted as 0."""
    if not windows:
        return 0.0
    estimate = 0.0
    for window in range(min(windows), max(windows) + 1):
        estimate = alpha * windows.get(window, 0) + (1 - alpha) * estimate
    return estimate


def history_rate(windows: Mapping[int, int]) -> float:
    """Mean hits per window over the whole span seen (first to last window, gaps as 0)."""
    if not windows:
        return 0.0
    return sum(windows.values()) / (max(windows) - min(windows) + 1)


def frequency_hits(windows: Mapping[int, int], alpha: float = 0.5) -> float:
    """Next-window hits: the EWMA (recent trend) averaged with the whole-history rate.

    The EWMA alone gives ``alpha·c`` for a single window of ``c`` requests and discounts a
    prefix seen a few times earlier towards 0; the history rate keeps every prefix seen
    predicted above 0 (its expected reuse), the EWMA still ranks recent ones higher.
    """
    return 0.5 * frequency_forecast(windows, alpha) + 0.5 * history_rate(windows)


#: A learned forecast's prediction is floored at this share of the prefix's history rate.
SEEN_FLOOR_SHARE = 0.1


def prefix_items(
    prefixes: Iterable[SharedPrefix],
    forecast: Mapping[str, float] | None = None,
    window_s: int = 300,
) -> list[WarmItem]:
    """Warm-up candidates for shared prefixes; hits from ``forecast`` or :func:`frequency_hits`.

    A prefix seen in the history is never predicted at exactly 0: a learned forecast's value is
    floored at :data:`SEEN_FLOOR_SHARE` of its history rate.
    """
    items = []
    for p in prefixes:
        if forecast is not None and p.key in forecast:
            hits = max(forecast[p.key], SEEN_FLOOR_SHARE * history_rate(p.windows))
        else:
            hits = frequency_hits(p.windows)
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
            )
        )
    return items
