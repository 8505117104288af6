"""Intents: groups of prompts that ask the same thing, for a semantic cache's warm-up.

Prompts are embedded with the house's one embedder (:class:`models.topics.PromptEmbedder`,
all-MiniLM-L6-v2, shared with the topic-drift trigger) and grouped by :class:`IntentModel`:

- ``threshold`` (the default): leader clustering at the semantic cache's own similarity
  threshold. Distinct prompts are taken most used first; each joins the most similar intent
  whose leader is within the threshold, or leads a new one. An intent is then what one entry
  (its leader's) would answer, and the number of intents needs no guess;
- ``kmeans``: MiniBatchKMeans with ``n_intents`` clusters (weighted by uses), for comparison.

``benchmarks/intents.py`` measures both (CPU seconds for 10,000 logged prompts, and the share
of unseen paraphrases a warmed entry answers, right or wrong, against the threshold).
An intent's next-window requests are forecast like any other item's
(:func:`forecast_intents`: the loop's frequency estimate on its counts per window).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from sklearn.cluster import MiniBatchKMeans

from models.baselines import FrequencyEstimate
from pipeline.errors import BadInputError, PrewarmError
from pipeline.evaluation import CountMatrix
from pipeline.windows import COUNT_DTYPES

METHODS = ("threshold", "kmeans")
#: the item kind of an intent in a counts table
INTENT_KIND = "intent"


class IntentsNotFittedError(PrewarmError):
    """The intent model was used before it was fitted."""


class IntentModel:
    """Prompt embeddings grouped into intents (see the module docstring)."""

    name = "intents"

    def __init__(
        self,
        threshold: float = 0.9,
        method: str = "threshold",
        n_intents: int | None = None,
        random_state: int = 0,
    ) -> None:
        self.threshold = threshold
        self.method = method
        self.n_intents = n_intents
        self.random_state = random_state

    def fit(
        self, vectors: np.ndarray, weights: Sequence[float] | np.ndarray | None = None
    ) -> IntentModel:
        """Learn ``labels_`` (one intent per vector) and ``centers_`` (unit vectors: the
        leaders for ``threshold``, the centroids for ``kmeans``); ``weights`` are uses."""
        points = _points(vectors)
        w = np.ones(len(points)) if weights is None else np.asarray(weights, dtype=float)
        if self.method == "threshold":
            self.labels_, self.centers_ = _leaders(points, w, self.threshold)
        elif self.method == "kmeans":
            self.labels_, self.centers_ = self._kmeans(points, w)
        else:
            raise BadInputError(f"unknown method {self.method!r} (one of {METHODS})",
                                where="intents.method")  # fmt: skip
        return self

    def _kmeans(self, points: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self.n_intents:
            raise BadInputError("kmeans needs n_intents", where="intents.n_intents")
        k = max(1, min(self.n_intents, len(points)))
        kmeans = MiniBatchKMeans(n_clusters=k, batch_size=1024, n_init=3,
                                 random_state=self.random_state)  # fmt: skip
        kmeans.fit(points, sample_weight=weights)
        centers = _unit(np.asarray(kmeans.cluster_centers_, dtype=float))
        return np.asarray((points @ centers.T).argmax(axis=1), dtype=np.int64), centers

    @property
    def n_intents_(self) -> int:
        return len(self._centers())

    def predict(self, vectors: np.ndarray) -> np.ndarray:
        """The intent of each vector: the most similar centre (-1 for ``threshold`` where none
        is within the threshold)."""
        similarity = _points(vectors) @ self._centers().T
        nearest = similarity.argmax(axis=1)
        if self.method != "threshold":
            return np.asarray(nearest, dtype=np.int64)
        return np.where(similarity.max(axis=1) >= self.threshold, nearest, -1).astype(np.int64)

    def representatives(
        self, vectors: np.ndarray, weights: Sequence[float] | np.ndarray | None = None
    ) -> list[list[int]]:
        """Per intent, its members (indices into ``vectors``, the fitted ones) best first: the
        uses of its members within the threshold of each (what an entry of that prompt would
        answer of what was asked), then the similarity to their mean direction (weighted by
        uses): a paraphrase not seen yet is likelier near the middle than at an edge."""
        points = _points(vectors)
        w = np.ones(len(points)) if weights is None else np.asarray(weights, dtype=float)
        self._centers()
        out = []
        for k in range(self.n_intents_):
            members = np.flatnonzero(self.labels_ == k)
            inner = points[members] @ points[members].T
            covered = (inner >= self.threshold).astype(float) @ w[members]
            central = points[members] @ _unit((w[members] @ points[members])[None, :])[0]
            order = np.lexsort((-central, -covered))
            out.append([int(members[i]) for i in order])
        return out

    def get_params(self) -> dict[str, Any]:
        """Constructor parameters."""
        return {k: v for k, v in vars(self).items() if not k.endswith("_")}

    def _centers(self) -> np.ndarray:
        if not hasattr(self, "centers_"):
            raise IntentsNotFittedError("IntentModel must be fitted before use")
        return self.centers_


def _leaders(
    points: np.ndarray, weights: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """Leader clustering, most used first (see the module docstring)."""
    order = np.argsort(-weights, kind="stable")
    leaders = np.zeros_like(points)
    labels = np.full(len(points), -1, dtype=np.int64)
    k = 0
    for i in order:
        if k:
            similarity = leaders[:k] @ points[i]
            best = int(similarity.argmax())
            if similarity[best] >= threshold:
                labels[i] = best
                continue
        leaders[k], labels[i] = points[i], k
        k += 1
    return labels, leaders[:k].copy()


def forecast_intents(
    per_window: Mapping[str, Mapping[float, int]], window_s: int
) -> dict[str, float]:
    """Next-window requests of each intent from its requests per window (Unix seconds of the
    window's start): the loop's frequency estimate (:class:`models.baselines.FrequencyEstimate`),
    as for an item without a learned forecast."""
    rows = [(key, start, n) for key, windows in per_window.items() for start, n in windows.items()]
    if not rows:
        return {}
    frame = pd.DataFrame({
        "item_kind": INTENT_KIND, "item_key": [r[0] for r in rows],
        "window_start": pd.to_datetime([r[1] for r in rows], unit="s", utc=True),
        "requests": [r[2] for r in rows], "prompt_tokens": 0, "output_tokens": 0,
    }).astype(COUNT_DTYPES)  # fmt: skip
    window = pd.Timedelta(seconds=window_s)
    model = FrequencyEstimate().fit(CountMatrix.from_counts(frame, window=window))
    predicted = model.predict_next(frame, kind=INTENT_KIND)
    return dict(zip(predicted["item_key"].astype(str), predicted["predicted"].astype(float),
                    strict=True))  # fmt: skip


def _points(vectors: np.ndarray) -> np.ndarray:
    points = np.asarray(vectors, dtype=float)
    if points.ndim != 2 or len(points) == 0:
        raise BadInputError("no prompt embeddings to group into intents", where="intents")
    return _unit(points)


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
