"""The requests of a gateway's log that a semantic cache can answer, and the text it embeds.

LiteLLM's semantic caches embed a chat request's message contents joined with nothing between
them (``get_semantic_cache_prompt_from_messages``: string contents, and the ``text`` of content
blocks) and look for an entry only among those of the same *scope*: the request's other
parameters (model group, temperature, ``max_tokens``, …, never the prompt) and the caller's key.
So an intent's entry serves its paraphrases only when they come with the same parameters, and
two requests are of one intent only when their scope is one.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from pipeline.gateway_log import body_text, deterministic
from pipeline.shared_prefixes import present

#: request fields that are the prompt; the rest make the semantic cache's scope
PROMPT_FIELDS = ("messages", "prompt", "input")


@dataclass(frozen=True, slots=True)
class IntentRequest:
    """One logged request a semantic cache could answer: when (Unix seconds), its endpoint,
    the text the gateway embeds, its scope (the parameters besides the prompt, as JSON) and
    the request as the client sent it."""

    ts: float
    endpoint: str
    text: str
    scope: str
    body: Mapping[str, Any]
    #: whether the gateway's cache answered it (None: its log does not say)
    hit: bool | None = None


def semantic_text(endpoint: str, body: Mapping[str, Any]) -> str | None:
    """The text LiteLLM's semantic cache embeds for a request (None: not one it caches)."""
    if endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        text = "".join(_content_text(m.get("content")) for m in messages if isinstance(m, dict))
        return text or None
    if endpoint == "completions":
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, str) and prompt else None
    return None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = (b.get("text") for b in content if isinstance(b, dict))
    return "".join(t for t in texts if isinstance(t, str))


def scope_of(body: Mapping[str, Any]) -> str:
    """The request's parameters besides its prompt (JSON, keys sorted): requests of one scope
    can share a semantic entry."""
    params = {k: v for k, v in body.items() if k not in PROMPT_FIELDS}
    return json.dumps(json.loads(body_text(params)), sort_keys=True, separators=(",", ":"))


def intent_requests(records: pd.DataFrame) -> tuple[list[IntentRequest], Counter[str]]:
    """The deterministic chat and completions requests of a gateway's ``records`` (prewarm's
    own left out by the caller), and the rejects counted by why: a body that is not JSON, a
    request with no text to embed, a sampled request (no single answer to store)."""
    out: list[IntentRequest] = []
    rejects: Counter[str] = Counter()
    if records.empty or "request_body" not in records.columns:
        return out, rejects
    epoch = pd.Timestamp(0, tz="UTC")
    seconds = (pd.to_datetime(records["ts"], utc=True) - epoch).dt.total_seconds()
    hits = records["cache_hit"] if "cache_hit" in records.columns else [None] * len(records)
    rows = zip(seconds, records["endpoint"], records["request_body"], hits, strict=True)
    for ts, endpoint, raw, hit in rows:
        endpoint = present(endpoint)
        if endpoint not in ("chat", "completions") or present(raw) is None or pd.isna(ts):
            continue
        request, why = _request(float(ts), str(endpoint), str(raw))
        if request is None:
            rejects[why] += 1
        else:
            known = None if hit is None or pd.isna(hit) else bool(hit)
            out.append(replace(request, hit=known))
    return out, rejects


def _request(ts: float, endpoint: str, raw: str) -> tuple[IntentRequest | None, str]:
    try:
        body = json.loads(raw)
    except ValueError:
        return None, "body not JSON"
    if not isinstance(body, dict):
        return None, "body not an object"
    if not deterministic(body):
        return None, "sampled"
    text = semantic_text(endpoint, body)
    if text is None:
        return None, "no text"
    return IntentRequest(ts, endpoint, text, scope_of(body), body), ""


def window_counts(
    starts: Sequence[float], labels: Sequence[str], window_s: int
) -> dict[str, dict[float, int]]:
    """Requests per label and window start (Unix seconds)."""
    out: dict[str, dict[float, int]] = {}
    for ts, label in zip(starts, labels, strict=True):
        window = float(ts // window_s * window_s)
        per = out.setdefault(label, {})
        per[window] = per.get(window, 0) + 1
    return out


@dataclass(frozen=True, slots=True)
class IntentWindow:
    """One intent's requests in one window (Unix seconds of its start) and how many the
    gateway's cache answered, by its log; ``label`` is its most representative prompt."""

    gateway: str
    intent: str
    label: str
    start: float
    requests: int
    hits: int

    def to_dict(self) -> dict[str, Any]:
        return {"gateway": self.gateway, "intent": self.intent, "label": self.label,
                "requests": self.requests, "hits": self.hits}  # fmt: skip


def intent_windows(
    gateway: str, requests: Sequence[IntentRequest], labels: Sequence[str],
    names: Mapping[str, str], window_s: int,
) -> list[IntentWindow]:  # fmt: skip
    """Requests and cache hits per intent (``labels``, one per request; ``names``: intent →
    label) and window, of the requests whose log line says whether the cache answered."""
    counts: dict[tuple[str, float], list[int]] = {}
    for request, label in zip(requests, labels, strict=True):
        if request.hit is None:
            continue
        cell = counts.setdefault((label, float(request.ts // window_s * window_s)), [0, 0])
        cell[0] += 1
        cell[1] += int(request.hit)
    return [IntentWindow(gateway, intent, names.get(intent, intent), start, n, h)
            for (intent, start), (n, h) in sorted(counts.items())]  # fmt: skip
