"""Intents from a gateway's log: the requests a semantic cache can answer (bad lines counted),
grouping by meaning (leader clustering at the threshold, MiniBatchKMeans for comparison), the
forecast, the wrong-intent check and the items a semantic gateway gets. Vectors are drawn
around known directions (the MiniLM model itself runs in the benchmark's smoke test and the
semantic gateway's integration test)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from models.intents import IntentModel, IntentsNotFittedError, forecast_intents
from models.topics import PromptEmbedder
from pipeline.errors import BadInputError, EngineUnavailableError
from pipeline.intents.collisions import first_collision
from pipeline.intents.requests import intent_requests, scope_of, semantic_text
from tasks.services.intents import find_intents
from tasks.settings import GatewaySettings

DIM = 32


def around(direction: np.ndarray, n: int, rng: np.random.Generator, spread=0.1) -> np.ndarray:
    points = direction + spread * rng.standard_normal((n, len(direction))) / np.sqrt(len(direction))
    return points / np.linalg.norm(points, axis=1, keepdims=True)


def directions(k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    d = rng.standard_normal((k, DIM))
    return d / np.linalg.norm(d, axis=1, keepdims=True)


def chat(text: str, **params) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}],
            "temperature": 0, "max_tokens": 8, **params}  # fmt: skip


def records(bodies: list[tuple[float, str, object]]) -> pd.DataFrame:
    """Gateway log records: (ts, endpoint, body: a dict, or raw text)."""
    return pd.DataFrame({
        "ts": pd.to_datetime([b[0] for b in bodies], unit="s", utc=True),
        "endpoint": [b[1] for b in bodies],
        "request_body": [b[2] if b[2] is None or isinstance(b[2], str) else json.dumps(b[2])
                         for b in bodies],
    })  # fmt: skip


def test_the_text_embedded_is_the_gateways_and_the_scope_leaves_the_prompt_out():
    body = {"model": "m", "messages": [
        {"role": "system", "content": "Be brief. "},
        {"role": "user", "content": [{"type": "text", "text": "How do I"}, {"type": "image"}]},
        {"role": "user", "content": " reset it?"}], "temperature": 0}  # fmt: skip
    assert semantic_text("chat", body) == "Be brief. How do I reset it?"
    assert semantic_text("completions", {"prompt": "Q: why?"}) == "Q: why?"
    assert semantic_text("embeddings", {"input": "x"}) is None
    assert scope_of(chat("a")) == scope_of(chat("something else"))
    assert scope_of(chat("a")) != scope_of(chat("a", max_tokens=9))


def test_bad_lines_are_counted_never_raised():
    rows = [
        (0, "chat", chat("How do I reset my password?")),
        (1, "chat", "{not json"),
        (2, "chat", "[1, 2]"),
        (3, "chat", {**chat("Write a poem"), "temperature": 0.8}),
        (4, "chat", {"model": "m", "messages": [], "temperature": 0}),
        (5, "embeddings", {"model": "e", "input": ["x"]}),
        (6, "chat", None),
    ]
    found, rejects = intent_requests(records(rows))
    assert [r.text for r in found] == ["How do I reset my password?"]
    assert rejects == {"body not JSON": 1, "body not an object": 1, "sampled": 1, "no text": 1}
    assert intent_requests(pd.DataFrame())[0] == []


def test_leader_clustering_finds_the_intents_without_being_told_how_many():
    rng = np.random.default_rng(1)
    d = directions(6)
    points = np.vstack([around(v, 20, rng) for v in d])
    model = IntentModel(threshold=0.9).fit(points)
    assert model.n_intents_ == 6
    labels = model.labels_.reshape(6, 20)
    assert all(len(set(row)) == 1 for row in labels) and len({row[0] for row in labels}) == 6
    assert (model.predict(around(d[2], 5, rng)) == labels[2][0]).all()
    assert (model.predict(-d[:1]) == -1).all()  # nothing near: no intent


def test_kmeans_needs_its_number_and_groups_the_same_points():
    rng = np.random.default_rng(2)
    points = np.vstack([around(v, 20, rng) for v in directions(4)])
    with pytest.raises(BadInputError):
        IntentModel(method="kmeans").fit(points)
    labels = IntentModel(method="kmeans", n_intents=4).fit(points).labels_.reshape(4, 20)
    assert all(len(set(row)) == 1 for row in labels)
    with pytest.raises(IntentsNotFittedError):
        IntentModel().predict(points)


def test_the_representative_is_the_middle_of_its_intent_not_its_most_used_edge():
    # three wordings on an arc, all within the threshold of each other: the most used one
    # (an edge) leads the intent; the middle one, nearest where the uses lie, represents it
    a, b = directions(2, seed=3)
    b = b - (b @ a) * a
    b /= np.linalg.norm(b)
    arc = np.vstack([np.cos(t) * a + np.sin(t) * b for t in (0.0, 0.15, 0.3)])
    model = IntentModel(threshold=0.9).fit(arc, [5, 1, 4])
    assert model.n_intents_ == 1 and model.labels_[0] == 0
    assert model.representatives(arc, [5, 1, 4])[0][0] == 1
    # a wording outside the leader's threshold leads an intent of its own
    wide = np.vstack([arc, np.cos(0.5) * a + np.sin(0.5) * b])
    model = IntentModel(threshold=0.95).fit(wide, [5, 1, 4, 3])
    assert model.n_intents_ == 2 and list(model.labels_) == [0, 0, 0, 1]


def test_an_intent_is_forecast_like_any_item():
    per_window = {"hot": {0.0: 4, 60.0: 6, 120.0: 8}, "cooling": {0.0: 8, 60.0: 2, 120.0: 0},
                  "new": {120.0: 3}}  # fmt: skip
    predicted = forecast_intents(per_window, 60)
    assert predicted["hot"] > predicted["new"] > 0
    assert predicted["hot"] > predicted["cooling"]
    assert forecast_intents({}, 60) == {}


def test_a_collision_is_another_intents_prompt_within_the_threshold():
    d = directions(3, seed=4)
    near = (d[0] + 0.2 * d[1]) / np.linalg.norm(d[0] + 0.2 * d[1])
    others = [("a", "own prompt"), ("b", "close prompt"), ("c", "far prompt")]
    vectors = np.vstack([d[0], near, d[2]])
    hit = first_collision("a", d[0], others, vectors, threshold=0.9)
    assert hit is not None and (hit.other, hit.prompt) == ("b", "close prompt")
    assert "not warmed" in hit.note(0.9) and "close prompt" in hit.note(0.9)
    assert first_collision("a", d[0], others, vectors, threshold=0.999) is None
    assert first_collision("b", near, others[1:2], vectors[1:2], threshold=0.5) is None


class Table:
    """An encoder that looks texts up in a table of vectors (pure logic, no model)."""

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table
        self.calls = 0

    def encode(self, sentences, **kwargs):
        self.calls += 1
        return np.vstack([self.table[s] for s in sentences])


def gateway(**kw) -> GatewaySettings:
    return GatewaySettings(name="edge", url="http://gw:4000", engine="e", cache="semantic",
                           similarity_threshold=0.9, probes=2, **kw)  # fmt: skip


def test_a_semantic_gateway_gets_its_frequent_intents_and_a_colliding_one_is_left_cold():
    rng = np.random.default_rng(5)
    d = directions(5, seed=5)
    table, rows = {}, []
    for k, direction in enumerate(d[:3]):  # three intents, three paraphrases, two windows each
        for n, v in enumerate(around(direction, 3, rng, spread=0.05)):
            table[f"intent {k} wording {n}"] = v
            rows += [(w * 60 + n, "chat", chat(f"intent {k} wording {n}")) for w in range(2)]
    table["rare neighbour"] = d[3]  # another intent, asked once: far in prewarm's embedding,
    rows.append((100, "chat", chat("rare neighbour")))
    gateway_table = dict(table)  # but next to intent 0 in the gateway's own
    gateway_table["rare neighbour"] = table["intent 0 wording 0"]
    encoder = Table(table)
    embedder = PromptEmbedder(encoder)
    check = PromptEmbedder(Table(gateway_table), tail_chars=None)
    found = find_intents(gateway(), records(rows), 60, embedder=lambda: embedder,
                         checker=lambda g: check)  # fmt: skip
    items, notes = found.items, found.notes
    warmed = {i.request["messages"][0]["content"].split(" wording")[0] for i in items}
    assert warmed == {"intent 1", "intent 2"}  # intent 0's entry would answer the neighbour
    assert any("not warmed" in n and "rare neighbour" in n for n in notes), notes
    for item in items:
        assert item.kind == "intent" and item.gateway == "edge" and item.predicted_hits > 0
        assert len(item.probes) == 2
        own = item.request["messages"][0]["content"].split(" wording")[0]
        assert all(own not in p["messages"][0]["content"] for p in item.probes)
    # without the gateway's embedding the check has prewarm's, and says so
    found = find_intents(gateway(), records(rows), 60, embedder=lambda: embedder,
                         checker=lambda g: None)  # fmt: skip
    items, notes = found.items, found.notes
    assert len(items) == 3 and any("prewarm's embedder" in n for n in notes)
    # the embeddings are cached by prompt hash: another plan embeds nothing again
    calls = encoder.calls
    find_intents(gateway(), records(rows), 60, embedder=lambda: embedder, checker=lambda g: None)
    assert encoder.calls == calls


def test_a_gateway_that_cannot_embed_gets_no_unchecked_intent():
    rows = [(w * 60 + n, "chat", chat(f"question {n}")) for w in range(2) for n in range(3)]
    table = {f"question {n}": v for n, v in enumerate(directions(3, seed=6))}
    embedder = PromptEmbedder(Table(table))

    class Down:
        def encode(self, sentences, **kwargs):
            raise EngineUnavailableError("gateway edge /v1/embeddings: ConnectError")

    found = find_intents(gateway(), records(rows), 60, embedder=lambda: embedder,
                         checker=lambda g: PromptEmbedder(Down()))  # fmt: skip
    items, notes = found.items, found.notes
    assert items == [] and any("could not embed" in n for n in notes)
