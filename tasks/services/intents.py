"""A semantic gateway's candidates: its frequent intents, each warmed with one representative.

From the gateway's request log (:func:`pipeline.intents.requests.intent_requests`: the
deterministic requests, the text the gateway embeds, their scope), per scope:

1. the distinct texts are embedded with the worker's one embedder (:mod:`tasks.adapters.embedder`,
   shared with the topic-drift trigger: one model load, one cache by prompt hash) and grouped
   into intents (:class:`models.intents.IntentModel`, at the gateway's threshold);
2. each intent's requests per window are forecast like any item's
   (:func:`models.intents.forecast_intents`); intents asked at least ``min_count`` times are
   candidates, with that forecast as their predicted hits;
3. **the wrong-intent check**: each candidate's representative (its members best first,
   :meth:`~models.intents.IntentModel.representatives`) is compared with the logged prompts of
   every other intent of its scope, in the gateway's own embedding (its
   ``embedding_model``, through the gateway) and at its threshold. The first member that
   would answer no other intent's prompt is warmed; an intent whose every tried member would
   is not, and the plan's notes say which prompt of which intent it would have answered;
4. the item carries, as probes, the other intents' prompts nearest its representative: sent
   after warming (:mod:`tasks.adapters.targets.semantic`), they must not hit its entry.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from models.intents import IntentModel, forecast_intents
from models.topics import PromptEmbedder
from pipeline.errors import PrewarmError
from pipeline.intents.collisions import Collision, first_collision
from pipeline.intents.requests import (
    IntentRequest,
    IntentWindow,
    intent_requests,
    intent_windows,
    window_counts,
)
from pipeline.planner.plan import WarmItem
from pipeline.prefix_blocks import count_tokens
from tasks.adapters.embedder import shared_embedder
from tasks.adapters.gateway_client import GatewayClient
from tasks.settings import GatewaySettings

log = logging.getLogger(__name__)

#: members of an intent tried as its representative before it is left cold
TRIED_MEMBERS = 3


@dataclass
class Intent:
    """One intent of a scope: its distinct texts (indices), uses, forecast."""

    key: str
    members: list[int]
    uses: int
    predicted: float = 0.0


class GatewayEncoder:
    """The gateway's own embedding model behind :class:`models.topics.TextEncoder`."""

    def __init__(self, client: GatewayClient, model: str) -> None:
        self.client = client
        self.model = model

    def encode(self, sentences: list[str], **kwargs: Any) -> np.ndarray:
        batch = int(kwargs.get("batch_size") or 32)
        vectors: list[list[float]] = []
        for start in range(0, len(sentences), batch):
            vectors += self.client.embed(self.model, sentences[start : start + batch])
        points = np.asarray(vectors, dtype=np.float32)
        return points / np.maximum(np.linalg.norm(points, axis=1, keepdims=True), 1e-12)


_GATEWAY_EMBEDDERS: dict[tuple[str, str, str], PromptEmbedder] = {}


def gateway_embedder(gateway: GatewaySettings) -> PromptEmbedder | None:
    """The gateway's embeddings (whole texts, as it embeds them), cached by prompt hash for the
    process; None when no ``embedding_model`` is configured."""
    if not gateway.embedding_model:
        return None
    key = (gateway.name, gateway.url, gateway.embedding_model)
    if key not in _GATEWAY_EMBEDDERS:
        encoder = GatewayEncoder(GatewayClient(gateway), gateway.embedding_model)
        _GATEWAY_EMBEDDERS[key] = PromptEmbedder(encoder, tail_chars=None)
    return _GATEWAY_EMBEDDERS[key]


@dataclass
class Intents:
    """What a semantic gateway's log gave: items to warm, the plan's notes, and each intent's
    requests and cache hits per window (for the report)."""

    items: list[WarmItem]
    notes: list[str]
    windows: list[IntentWindow]


def find_intents(
    gateway: GatewaySettings,
    records: pd.DataFrame,
    window_s: int,
    embedder: Callable[[], PromptEmbedder] = shared_embedder,
    checker: Callable[[GatewaySettings], PromptEmbedder | None] = gateway_embedder,
) -> Intents:
    """The gateway's frequent intents as ``intent`` items, the plan's notes (see the module
    docstring) and each intent's requests and hits per window; ``records`` are its clients'
    (prewarm's own left out)."""
    requests, rejects = intent_requests(records)
    notes = [f"intents of {gateway.name}: rejected {dict(rejects)}"] if rejects else []
    scopes: dict[str, list[IntentRequest]] = defaultdict(list)
    for request in requests:
        scopes[request.scope].append(request)
    check = checker(gateway)
    if check is None and scopes:
        notes.append(f"intents of {gateway.name}: collisions checked with prewarm's embedder "
                     "(no embedding_model configured)")  # fmt: skip
    out = Intents([], notes, [])
    for scoped in scopes.values():
        try:
            _scope_items(gateway, scoped, window_s, embedder(), check, out)
        except PrewarmError as exc:  # no check, no warm-up: an unchecked entry may mislead
            notes.append(f"intents of {gateway.name}: none warmed, the wrong-intent check "
                         f"could not embed ({exc})")  # fmt: skip
    notes.append(f"intents of {gateway.name}: {len(out.items)} to warm from {len(requests)} "
                 "requests")  # fmt: skip
    return out


def _scope_items(
    gateway: GatewaySettings,
    requests: Sequence[IntentRequest],
    window_s: int,
    embedder: PromptEmbedder,
    check: PromptEmbedder | None,
    out: Intents,
) -> None:
    texts = sorted({r.text for r in requests})
    index = {t: n for n, t in enumerate(texts)}
    uses = np.bincount([index[r.text] for r in requests], minlength=len(texts)).astype(float)
    vectors = embedder.embed(texts)
    model = IntentModel(threshold=gateway.similarity_threshold).fit(vectors, uses)
    order = model.representatives(vectors, uses)
    scope_tag = _hash(requests[0].scope)[:8]
    keys = [f"{scope_tag}-{_hash(texts[members[0]])[:12]}" for members in order]
    labels = [keys[int(k)] for k in model.labels_]
    per_window = window_counts([r.ts for r in requests], [labels[index[r.text]] for r in requests],
                               window_s)  # fmt: skip
    predicted = forecast_intents(per_window, window_s)
    names = {keys[k]: texts[members[0]][:80] for k, members in enumerate(order)}
    by_request = [labels[index[r.text]] for r in requests]
    out.windows += intent_windows(gateway.name, requests, by_request, names, window_s)
    checked = check.embed(texts) if check is not None else vectors
    others = [(labels[n], t) for n, t in enumerate(texts)]
    bodies = {r.text: r.body for r in requests}
    for k, members in enumerate(order):
        used = int(uses[members].sum())
        if used < gateway.min_count:
            continue
        chosen, collision = _representative(keys[k], members, checked, others, gateway)
        if chosen is None:
            if collision is not None:
                out.notes.append(collision.note(gateway.similarity_threshold))
            continue
        probes = _probes(keys[k], checked[chosen], checked, others, bodies, gateway.probes)
        out.items.append(_item(gateway, keys[k], requests, texts[chosen], bodies[texts[chosen]],
                               predicted.get(keys[k], float(used)), probes))  # fmt: skip


def _representative(
    key: str,
    members: Sequence[int],
    vectors: np.ndarray,
    others: Sequence[tuple[str, str]],
    gateway: GatewaySettings,
) -> tuple[int | None, Collision | None]:
    """The first of ``members`` whose entry would answer no other intent's prompt."""
    first: Collision | None = None
    for member in members[:TRIED_MEMBERS]:
        collision = first_collision(key, vectors[member], others, vectors,
                                    gateway.similarity_threshold)  # fmt: skip
        if collision is None:
            return member, first
        first = first or collision
    return None, first


def _probes(
    key: str,
    vector: np.ndarray,
    vectors: np.ndarray,
    others: Sequence[tuple[str, str]],
    bodies: dict[str, Any],
    n: int,
) -> tuple[dict[str, Any], ...]:
    """The ``n`` prompts of other intents nearest the representative (the likeliest to be
    answered by its entry), as their clients sent them."""
    foreign = [i for i, (label, _) in enumerate(others) if label != key]
    if not foreign or n <= 0:
        return ()
    similarity = vectors[foreign] @ vector
    nearest = [foreign[i] for i in np.argsort(-similarity, kind="stable")[:n]]
    return tuple(dict(bodies[others[i][1]]) for i in nearest)


def _item(
    gateway: GatewaySettings,
    key: str,
    requests: Sequence[IntentRequest],
    text: str,
    body: Any,
    predicted: float,
    probes: tuple[dict[str, Any], ...],
) -> WarmItem:
    endpoint = next(r.endpoint for r in requests if r.text == text)
    messages = body.get("messages")
    return WarmItem(
        "intent", f"intent:{gateway.name}:{key}", str(body.get("model") or "unknown"),
        text=None if messages is not None else text,
        messages=tuple(messages) if messages is not None else None, endpoint=endpoint,
        tokens=count_tokens(text), predicted_hits=predicted, gateway=gateway.name,
        request=dict(body), probes=probes,
    )  # fmt: skip


def _hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
