"""The worker process's one sentence embedder (all-MiniLM-L6-v2, :mod:`models.topics`).

The topic-drift trigger and the intents of semantic gateways share it: the model is loaded once
per process (seconds, hundreds of MiB), and its cache of embeddings by prompt hash serves both
for as long as the process lives.
"""

from __future__ import annotations

from functools import lru_cache

from models.topics import PromptEmbedder, load_minilm


@lru_cache(maxsize=1)
def shared_embedder() -> PromptEmbedder:
    """The process's embedder, built on first use."""
    return PromptEmbedder(load_minilm())
