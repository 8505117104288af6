"""Wrong-intent answers found before warming (pure): a representative that another intent's
prompt would find within the semantic cache's threshold.

A semantic cache answers a request with the nearest entry of its scope when their cosine
similarity is at least its threshold. An entry warmed for intent A whose prompt is that close
to a logged prompt of intent B would answer B's users with A's answer. Vectors are the
gateway's own embeddings (its embedding model, as it embeds), compared with its threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Collision:
    """The closest prompt of another intent that a representative would answer."""

    intent: str
    other: str
    prompt: str
    similarity: float

    def note(self, threshold: float) -> str:
        """What the plan says about it."""
        return (f"intent {self.intent} not warmed: its entry would answer intent "
                f"{self.other}'s {self.prompt[:60]!r} (similarity {self.similarity:.3f} >= "
                f"{threshold})")  # fmt: skip


def first_collision(
    intent: str,
    vector: np.ndarray,
    others: Sequence[tuple[str, str]],
    other_vectors: np.ndarray,
    threshold: float,
) -> Collision | None:
    """The most similar of ``others`` ((intent, prompt) pairs, their vectors in ``other_vectors``)
    that belongs to another intent and is within ``threshold`` of ``vector``; None when none
    is."""
    if not len(others):
        return None
    similarity = _unit(other_vectors) @ _unit(vector[None, :])[0]
    foreign = np.array([label != intent for label, _ in others])
    similarity = np.where(foreign, similarity, -np.inf)
    best = int(np.argmax(similarity))
    if similarity[best] < threshold:
        return None
    other, prompt = others[best]
    return Collision(intent, other, prompt, float(similarity[best]))


def _unit(vectors: np.ndarray) -> np.ndarray:
    points = np.asarray(vectors, dtype=np.float64)
    return points / np.maximum(np.linalg.norm(points, axis=1, keepdims=True), 1e-12)
