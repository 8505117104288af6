"""Pure parts of the engine simulator: block cache, chat template, outputs, log formatting."""

from __future__ import annotations

import io
import re

import pytest

from jobs.simulator.cache import BlockPrefixCache
from jobs.simulator.chat import render_chat
from jobs.simulator.outputs import generate_tokens, natural_length
from jobs.simulator.vllm_log import SamplingParamsView, VllmLogWriter
from pipeline.errors import BadInputError
from pipeline.prefix_blocks import block_hashes
from tests.conftest import REPO_ROOT


def test_only_a_leading_run_of_cached_blocks_is_reused():
    cache = BlockPrefixCache(capacity_blocks=10)
    cache.insert(["a", "b", "c"])
    assert cache.lookup(["a", "b", "c", "d"]).hit_blocks == 3
    assert cache.lookup(["x", "b", "c"]).hit_blocks == 0


def test_least_recently_used_blocks_are_evicted_first():
    cache = BlockPrefixCache(capacity_blocks=3)
    cache.insert(["a", "b"])
    cache.insert(["c"])
    cache.lookup(["a"])  # a is now more recent than b
    cache.insert(["d"])
    assert "b" not in cache
    assert all(h in cache for h in ("a", "c", "d"))
    assert cache.evictions == 1 and len(cache) == 3


def test_clear_empties_the_cache():
    cache = BlockPrefixCache(capacity_blocks=4)
    cache.insert(["a", "b"])
    assert cache.clear() == 2 and cache.lookup(["a"]).hit_blocks == 0


def test_chats_with_one_system_prompt_share_its_blocks():
    system = {"role": "system", "content": "You answer questions about invoices. " * 20}
    one = render_chat([system, {"role": "user", "content": "Where is my refund?"}])
    two = render_chat([system, {"role": "user", "content": "Why was I charged twice?"}])
    a, b = block_hashes(one), block_hashes(two)
    shared = sum(1 for x, y in zip(a, b, strict=False) if x == y)
    assert shared >= 7 and one != two
    assert one.endswith("<|im_start|>assistant\n")


def test_chat_content_parts_are_flattened_to_text():
    prompt = render_chat([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert "<|im_start|>user\nhi<|im_end|>" in prompt


@pytest.mark.parametrize("messages", [[], "text", [{"role": "wizard", "content": "x"}], None])
def test_malformed_messages_are_bad_input(messages):
    with pytest.raises(BadInputError, match="messages"):
        render_chat(messages)


def test_outputs_depend_only_on_prompt_model_and_seed():
    first = generate_tokens("prompt", "m", count=5, top_n=2)
    assert first == generate_tokens("prompt", "m", count=5, top_n=2)
    assert first != generate_tokens("other prompt", "m", count=5, top_n=2)
    assert natural_length("p", "m", None) == natural_length("p", "m", None)
    assert all(t.logprob < 0 and len(t.top) == 2 for t in first)


def _field_names(text: str) -> list[str]:
    inner = text[text.index("SamplingParams(") + len("SamplingParams(") :]
    return re.findall(r"(?:^|, )(\w+)=", inner[: inner.index("), lora_request")])


def test_sampling_params_repr_has_the_field_order_of_a_real_vllm():
    real = (REPO_ROOT / "tests" / "data" / "vllm-0.32-cpu-debug.log").read_text()
    line = next(ln for ln in real.splitlines() if "Received request" in ln)
    ours = f"{SamplingParamsView(temperature=0.6)!r}, lora_request: None."
    assert _field_names(ours) == _field_names(line)


def test_greedy_params_are_normalised_like_vllm():
    text = repr(SamplingParamsView(temperature=0.0, top_p=0.5, top_k=40))
    assert "temperature=0.0, watermarking=None, top_p=1.0, top_k=0, min_p=0.0" in text


def test_a_log_writer_without_sinks_writes_nothing_and_one_with_a_stream_writes_lines():
    params = SamplingParamsView(max_tokens=1)
    silent = VllmLogWriter(pid=7)
    silent.request("r-1", "a prompt", [1, 2], params, None)
    assert not silent.enabled
    stream = io.StringIO()
    loud = VllmLogWriter(pid=7, stream=stream)
    loud.request("r-1", "a prompt", [1, 2], params, None)
    lines = stream.getvalue().splitlines()
    assert loud.enabled and len(lines) == 2
    assert "Request r-1 details: prompt: 'a prompt'" in lines[0]
    assert lines[1].startswith("(APIServer pid=7) INFO ") and "Received request r-1" in lines[1]
