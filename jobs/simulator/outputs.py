"""Deterministic simulated outputs: the same prompt and parameters give the same tokens.

Tokens are words drawn from a small vocabulary by a generator seeded with a hash of the prompt,
the model and the request's seed. Log-probabilities come from the same generator, so a response
and its confidence can be checked by asking again.
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass

_VOCABULARY = (
    "the",
    "cache",
    "warm",
    "prefix",
    "token",
    "model",
    "request",
    "answer",
    "system",
    "user",
    "query",
    "data",
    "value",
    "result",
    "engine",
    "block",
    "time",
    "fast",
    "first",
    "latency",
    "serve",
    "prompt",
    "template",
    "window",
    "plan",
    "batch",
    "state",
    "ready",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "for",
    "on",
    "with",
    "as",
    "it",
    "that",
    "this",
    "by",
    "from",
    "at",
    "are",
    "be",
    "simulated",
)

#: Shortest and longest natural answer (before ``max_tokens`` cuts it), in tokens.
MIN_NATURAL_TOKENS = 8
MAX_NATURAL_TOKENS = 48
VOCAB_SIZE = 151_936  # Qwen2's vocabulary size: token ids look like a real model's


@dataclass(frozen=True, slots=True)
class SimulatedToken:
    """One generated token with its log-probability and the alternatives considered."""

    text: str
    token_id: int
    logprob: float
    top: tuple[tuple[str, float], ...]


@functools.lru_cache(maxsize=1 << 16)
def token_id(text: str) -> int:
    """A stable token id for a (pseudo-)token's text (memoised: token texts repeat a lot)."""
    digest = hashlib.blake2b(text.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % VOCAB_SIZE


def _rng(prompt: str, model: str, seed: int | None) -> random.Random:
    key = f"{model}\x00{seed}\x00{prompt}".encode()
    return random.Random(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big"))


def natural_length(prompt: str, model: str, seed: int | None) -> int:
    """How many tokens the simulated model would write before stopping on its own."""
    return _rng(prompt, model, seed).randint(MIN_NATURAL_TOKENS, MAX_NATURAL_TOKENS)


def generate_tokens(
    prompt: str, model: str, *, count: int, seed: int | None = None, top_n: int = 0
) -> list[SimulatedToken]:
    """The first ``count`` tokens the simulated model answers ``prompt`` with."""
    rng = _rng(prompt, model, seed)
    rng.random()  # the first draw decides the natural length; keep tokens independent of it
    tokens: list[SimulatedToken] = []
    for position in range(count):
        word = rng.choice(_VOCABULARY)
        text = word if position == 0 else " " + word
        logprob = -round(rng.uniform(0.001, 1.2), 4)
        alternatives = [(" " + rng.choice(_VOCABULARY), logprob - rng.uniform(0.1, 3.0))]
        alternatives += [
            (" " + rng.choice(_VOCABULARY), -rng.uniform(2.0, 8.0)) for _ in range(top_n)
        ]
        top = tuple([(text, logprob), *sorted(alternatives, key=lambda a: -a[1])][:top_n])
        tokens.append(SimulatedToken(text, token_id(text), logprob, top))
    return tokens


EMBEDDING_DIM = 64


def _word_vector(word: str) -> list[float]:
    digest = hashlib.blake2b(word.lower().encode(), digest_size=EMBEDDING_DIM // 8).digest()
    return [1.0 if byte >> bit & 1 else -1.0 for byte in digest for bit in range(8)]


def embed_text(text: str) -> list[float]:
    """A deterministic unit vector: the normalised sum of the text's hashed words.

    Texts that share words point the same way, so a semantic cache sees near neighbours; it is
    a stand-in for a pooling model, not a model.
    """
    total = [0.0] * EMBEDDING_DIM
    for word in text.split() or [""]:
        total = [a + b for a, b in zip(total, _word_vector(word.strip(".,;:!?")), strict=True)]
    norm = sum(x * x for x in total) ** 0.5 or 1.0
    return [round(x / norm, 6) for x in total]
