"""What an engine says of tokens and its cache: real token counts by its tokenizer
(``POST /tokenize``), and its KV cache's block size and number of blocks (``/metrics``)."""

from __future__ import annotations

import logging

import httpx

from pipeline.errors import PrewarmError
from pipeline.planner.plan import WarmItem
from tasks.adapters.engine_client import EngineClient, RetryPolicy
from tasks.settings import EngineSettings

log = logging.getLogger(__name__)
#: Most items measured by the engine's tokenizer per plan.
MAX_TOKENIZED = 256


def _tokenize_body(item: WarmItem, model: str) -> dict[str, object]:
    if item.messages is not None:
        return {"model": model, "messages": [dict(m) for m in item.messages]}
    body: dict[str, object] = {"model": model, "prompt": item.text}
    if "add_special_tokens" in item.params:
        body["add_special_tokens"] = item.params["add_special_tokens"]
    return body


def measure_tokens(
    items: list[WarmItem], engine: EngineSettings, limit: int = MAX_TOKENIZED
) -> dict[str, int]:
    """Real token counts of ``items`` by the engine's tokenizer (``POST /tokenize``).

    Returns what was measured (item key → tokens); empty when the engine has no tokenizer
    endpoint or does not answer — the caller keeps its estimates then.
    """
    # (an item primed with its exact token ids, a chain learned from KV events, is counted)
    prompts = [
        i for i in items if i.token_ids is None and (i.text is not None or i.messages is not None)
    ][:limit]
    counts: dict[str, int] = {}
    client = EngineClient(engine, timeout_s=10.0, retry=RetryPolicy(attempts=2))
    try:
        for item in prompts:
            body = client.post("/tokenize", _tokenize_body(item, engine.model)).json()
            counts[item.key] = int(body["count"])
    except (PrewarmError, ValueError, KeyError, TypeError) as exc:
        log.info("engine %s: no token counts (%s); using estimates", engine.name, exc)
        return counts
    finally:
        client.close()
    return counts


def engine_cache(engine: EngineSettings, transport: httpx.BaseTransport | None = None
                 ) -> tuple[int, int] | None:  # fmt: skip
    """(block size, number of blocks) of the engine's KV cache as vLLM publishes them
    (``vllm:cache_config_info``), or None when it does not (not vLLM, not up, not yet sized)."""
    client = EngineClient(engine, timeout_s=10.0, retry=RetryPolicy(attempts=1),
                          transport=transport)  # fmt: skip
    try:
        labels = client.cache_config() or {}
    finally:
        client.close()
    try:
        block, blocks = int(labels["block_size"]), int(labels["num_gpu_blocks"])
    except (KeyError, ValueError):  # absent, or "None" before the engine sized its cache
        return None
    return (block, blocks) if block > 0 and blocks > 1 else None
