"""Candidates for a gateway's cache (pure): requests its clients repeat, sent again as they are.

A gateway (LiteLLM's proxy) answers a request from its cache when the request's model group
and OpenAI parameters equal an earlier one's. From the gateway's request log
(:mod:`pipeline.gateway_log`), the requests asked at least ``min_count`` times with
deterministic parameters become ``response`` items, and the embeddings inputs used as often
(LiteLLM caches each input on its own) ``embedding`` items. Each item carries the request to
send (``WarmItem.request``); its key is prewarm's name for it, never the gateway's cache key.
When a template changes, :func:`changed_template_items` gives the same requests as the new
version renders them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from pipeline.gateway_log import body_text, deterministic, embedding_inputs
from pipeline.keys import response_key
from pipeline.planner.plan import WarmItem
from pipeline.prefix_blocks import count_tokens
from pipeline.shared_prefixes import present

#: request fields that are the prompt (the rest are the parameters of the item's key)
_PROMPT_FIELDS = ("messages", "prompt", "input")


def gateway_requests(records: pd.DataFrame) -> list[tuple[str, dict[str, Any]]]:
    """(endpoint, request) of each record that carries the request its client sent, prewarm's
    own requests left out by the caller."""
    if "request_body" not in records.columns:
        return []
    out = []
    for endpoint, body in zip(records["endpoint"], records["request_body"], strict=True):
        text = present(body)
        if text is None or present(endpoint) is None:
            continue
        try:
            value = json.loads(str(text))
        except ValueError:
            continue  # a body the log could not hold whole is not a request to replay
        if isinstance(value, dict):
            out.append((str(endpoint), value))
    return out


def _uses(requests: Iterable[tuple[str, dict[str, Any]]]) -> Counter[tuple[str, str]]:
    """Uses of each replayable request (its JSON, fields in the client's order) per endpoint;
    an embeddings request counts once for each of its inputs, as a request of that input alone."""
    counts: Counter[tuple[str, str]] = Counter()
    for endpoint, body in requests:
        if endpoint == "embeddings":
            for text in embedding_inputs(body):
                counts[(endpoint, body_text({**body, "input": [text]}))] += 1
        elif endpoint in ("chat", "completions") and deterministic(body):
            counts[(endpoint, body_text(body))] += 1
    return counts


def gateway_items(records: pd.DataFrame, gateway: str, min_count: int = 2) -> list[WarmItem]:
    """Candidates for ``gateway``'s cache from its request log's ``records`` (see the module
    docstring); predicted hits = the uses seen."""
    items = []
    for (endpoint, text), n in _uses(gateway_requests(records)).items():
        if n >= min_count:
            items.append(_item(gateway, endpoint, json.loads(text), float(n)))
    return items


@dataclass(frozen=True)
class HeadChange:
    """A template's static head before and after a change, and the new version's tag."""

    old: str
    new: str
    tag: str


def changed_template_items(
    records: pd.DataFrame,
    gateway: str,
    changes: Sequence[HeadChange],
    min_count: int = 2,
    offset: int = 64,
) -> list[WarmItem]:
    """The requests clients repeat that a changed template rendered, as the new version renders
    them: a message's content (or the completions prompt) that holds a changed head within
    ``offset`` characters of its start gets the new head in its place, the rest as it was.
    That is exactly the new rendering when the change is in the head; a change past the head
    (new variables, other blocks) cannot be rendered without the variables, which no log
    holds, and such a request is simply met by the gateway on its first use."""
    items = []
    for (endpoint, text), n in _uses(gateway_requests(records)).items():
        if n < min_count or endpoint == "embeddings":
            continue
        for change in sorted(changes, key=lambda c: len(c.old), reverse=True):
            body = _with_new_head(json.loads(text), change, offset)
            if body is not None:
                item = _item(gateway, endpoint, body, float(n))
                items.append(replace(item, template=change.tag))
                break
    return items


def _with_new_head(body: dict[str, Any], change: HeadChange, offset: int) -> dict[str, Any] | None:
    def swapped(text: Any) -> str | None:
        if not isinstance(text, str):
            return None
        at = text.find(change.old, 0, offset + len(change.old))
        return None if at < 0 else text[:at] + change.new + text[at + len(change.old) :]

    if isinstance(body.get("messages"), list):
        for n, message in enumerate(body["messages"]):
            content = swapped(message.get("content") if isinstance(message, dict) else None)
            if content is not None:
                messages = list(body["messages"])
                messages[n] = {**message, "content": content}
                return {**body, "messages": messages}
        return None
    prompt = swapped(body.get("prompt"))
    return None if prompt is None else {**body, "prompt": prompt}


def _item(gateway: str, endpoint: str, body: Mapping[str, Any], hits: float) -> WarmItem:
    params = {k: v for k, v in body.items() if k not in _PROMPT_FIELDS}
    messages = body.get("messages")
    text = None if messages is not None else _prompt_text(body)
    kind = "embedding" if endpoint == "embeddings" else "response"
    key = response_key(
        model=str(body.get("model") or "unknown"), template=f"gateway:{gateway}",
        params=params, text=text, messages=messages, tenant=gateway, kind=kind,
    ).render()  # fmt: skip
    shown = text if text is not None else json.dumps(messages)
    return WarmItem(
        kind, key, str(body.get("model") or "unknown"), text=text,
        messages=tuple(messages) if messages is not None else None, endpoint=endpoint,
        tenant="default", tokens=count_tokens(shown), predicted_hits=hits, gateway=gateway,
        request=dict(body),
    )  # fmt: skip


def _prompt_text(body: Mapping[str, Any]) -> str:
    value = body.get("prompt", body.get("input"))
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return str(value)
