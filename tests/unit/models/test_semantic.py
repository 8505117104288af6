"""Semantic clusters with the real all-MiniLM-L6-v2 (loaded from the installed package)."""

from __future__ import annotations

import pytest

from models.semantic import EmbeddingCache, SemanticClusters, SemanticNotFittedError, load_minilm

PROMPTS = [
    "How do I reset my password?",
    "I forgot my password, how can I change it?",
    "What are the steps to reset my account password?",
    "What is the weather forecast for Paris tomorrow?",
    "Will it rain in Paris tomorrow?",
    "Write a Python function that reverses a string.",
    "Give me Python code to reverse a string.",
]
GROUPS = [0, 0, 0, 1, 1, 2, 2]


@pytest.fixture(scope="module")
def cache() -> EmbeddingCache:
    return EmbeddingCache(load_minilm(), batch_size=8)


def test_paraphrases_share_a_cluster_and_topics_do_not(cache):
    clusters = SemanticClusters().fit(PROMPTS, cache)
    labels = list(clusters.labels_)
    by_group = {g: {labels[i] for i, x in enumerate(GROUPS) if x == g} for g in set(GROUPS)}
    assert all(len(found) == 1 for found in by_group.values()), labels
    assert len({next(iter(found)) for found in by_group.values()}) == 3, labels
    assert len(clusters.representatives_) == 3
    assert set(clusters.representatives_) <= set(PROMPTS)


def test_new_paraphrase_joins_its_cluster_and_embeddings_are_cached(cache):
    clusters = SemanticClusters().fit(PROMPTS, cache)
    known = len(cache)
    labels = clusters.predict(["How can I reset the password of my account?", *PROMPTS[:1]], cache)
    assert labels[0] == labels[1] == clusters.labels_[0]
    assert len(cache) == known + 1  # only the new text was embedded
    vectors = cache.embed(PROMPTS[:2])
    assert vectors.shape == (2, 384)
    assert abs(float((vectors[0] ** 2).sum()) - 1) < 1e-4


def test_unfitted_clusters_are_a_clear_error(cache):
    with pytest.raises(SemanticNotFittedError):
        SemanticClusters().predict(PROMPTS, cache)
