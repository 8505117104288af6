"""Topics over prompt embeddings: labels that hold, unseen prompts, the embedding cache and
persistence. Vectors are drawn around known directions (the MiniLM model itself runs in the
loop's integration test)."""

from __future__ import annotations

import numpy as np
import pytest

from models.persistence import load_model, save_model
from models.topics import (
    EMBEDDING_DIM,
    UNSEEN,
    PromptEmbedder,
    TopicModel,
    TopicsNotFittedError,
    prompt_tail,
)


def around(direction: np.ndarray, n: int, rng: np.random.Generator, spread=0.15) -> np.ndarray:
    points = direction + spread * rng.standard_normal((n, len(direction))) / np.sqrt(len(direction))
    return points / np.linalg.norm(points, axis=1, keepdims=True)


@pytest.fixture
def topics() -> tuple[np.ndarray, np.random.Generator]:
    rng = np.random.default_rng(0)
    directions = rng.standard_normal((4, EMBEDDING_DIM))
    return directions / np.linalg.norm(directions, axis=1, keepdims=True), rng


def test_topics_separate_directions_and_keep_their_labels_when_moved(topics):
    directions, rng = topics
    seen = np.vstack([around(d, 50, rng) for d in directions[:3]])
    model = TopicModel(n_topics=3).fit(seen)
    labels = model.predict(seen).reshape(3, 50)
    assert (labels == UNSEEN).mean() <= 0.05  # the fitted prompts' fringe (UNSEEN_QUANTILE)
    main = [np.bincount(row[row != UNSEEN]).argmax() for row in labels]
    assert len(set(main)) == 3 and all((row[row != UNSEEN] == m).all() for row, m in
                                        zip(labels, main, strict=True))  # fmt: skip
    model.partial_fit(around(directions[0], 200, rng, spread=0.3))
    moved = model.predict(around(directions[0], 20, rng))
    assert (moved[moved != UNSEEN] == main[0]).all()


def test_prompts_of_a_topic_never_fitted_are_unseen_and_the_mix_says_so(topics):
    directions, rng = topics
    model = TopicModel(n_topics=3).fit(np.vstack([around(d, 50, rng) for d in directions[:3]]))
    new = around(directions[3], 30, rng)
    assert (model.predict(new) == UNSEEN).all()
    mix = model.mix(np.vstack([new[:10], around(directions[0], 10, rng)]))
    assert 10 <= mix["unseen"] <= 11 and sum(mix.values()) == 20


def test_an_unfitted_model_says_so():
    with pytest.raises(TopicsNotFittedError):
        TopicModel().predict(np.ones((1, EMBEDDING_DIM)))


def test_saved_topics_load_back_with_the_same_labels(tmp_path, topics):
    directions, rng = topics
    points = np.vstack([around(d, 40, rng) for d in directions])
    model = TopicModel(n_topics=4).fit(points)
    save_model(model, tmp_path, "topics")
    loaded = load_model(tmp_path, "topics", kind="topics")
    assert (loaded.predict(points) == model.predict(points)).all()
    assert loaded.floor_ == model.floor_


class CountingEncoder:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def encode(self, sentences: list[str], **kwargs) -> np.ndarray:
        self.batches.append(list(sentences))
        rng = np.random.default_rng(len(self.batches))
        vectors = rng.standard_normal((len(sentences), EMBEDDING_DIM))
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_the_embedder_encodes_each_prompt_once_in_batches_and_stays_bounded():
    encoder = CountingEncoder()
    embedder = PromptEmbedder(encoder, max_cached=3)
    first = embedder.embed(["a", "b", "a"])
    assert first.shape == (3, EMBEDDING_DIM) and (first[0] == first[2]).all()
    again = embedder.embed(["b", "c"])
    assert (again[0] == first[1]).all()
    assert encoder.batches == [["a", "b"], ["c"]] and embedder.encoded == 3
    embedder.embed(["d"])
    assert len(embedder) == 3  # the least recently used ("a") went


def test_a_long_prompt_is_embedded_by_its_tail_where_the_question_is():
    prompt = "You are a helpful assistant. " * 100 + "How do I appeal a parking fine?"
    tail = prompt_tail(prompt)
    assert tail.endswith("How do I appeal a parking fine?") and len(tail) <= 400
    assert prompt[-len(tail) - 1] == " "  # cut at a word, not inside one
