"""Targets and the engine client against a mock transport (the HTTPX way to unit-test)."""

from __future__ import annotations

import json

import httpx
import pytest

from pipeline.errors import EngineUnavailableError
from pipeline.planner.plan import WarmItem
from tasks.adapters.engine_client import EngineClient, EngineError, RetryPolicy
from tasks.adapters.targets.base import BatchContext, WarmOptions
from tasks.adapters.targets.prefix import groups
from tasks.settings import EngineSettings

ENGINE = EngineSettings(name="e", url="http://engine.test", model="m")
FAST = RetryPolicy(attempts=3, base_s=0.0)


def _client(handler) -> EngineClient:
    return EngineClient(ENGINE, retry=FAST, transport=httpx.MockTransport(handler))


def _item(key, kind="prefix", **kw):
    kw.setdefault("text", f"text {key}")
    return WarmItem(kind, key, "m", **kw)


def test_text_prefixes_group_by_parameters_chat_goes_alone():
    items = [_item("a"), _item("b"), _item("c", params={"cache_salt": "t2"}),
             _item("d", text=None, messages=({"role": "system", "content": "x"},), endpoint="chat"),
             _item("e"), _item("f"), _item("g")]  # fmt: skip
    assert groups(items, 2) == [[0, 1], [2], [3], [4, 5], [6]]


def test_transient_failures_are_retried_then_raised():
    calls = []

    def flaky(request):
        calls.append(request)
        if len(calls) < 3:
            return httpx.Response(503)
        return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": {"prompt_tokens": 3}})

    assert _client(flaky).complete(_item("a")).text == "x" and len(calls) == 3
    with pytest.raises(EngineUnavailableError, match="HTTP 500 after retries"):
        _client(lambda r: httpx.Response(500)).complete(_item("a"))

    def down(request):
        raise httpx.ConnectTimeout("slow", request=request)

    with pytest.raises(EngineUnavailableError, match="ConnectTimeout"):
        _client(down).complete(_item("a"))


def test_client_errors_are_not_retried():
    calls = []

    def refuse(request):
        calls.append(request)
        return httpx.Response(400, text="bad prompt")

    with pytest.raises(EngineError):
        _client(refuse).complete(_item("a"))
    assert len(calls) == 1


def test_chat_items_use_the_chat_route_and_list_prompts_one_request():
    seen = []

    def engine(request):
        seen.append((request.url.path, json.loads(request.content)))
        usage = {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 8}}
        choice = {"message": {"content": "ok"}, "text": "ok"}
        return httpx.Response(200, json={"choices": [choice], "usage": usage})

    client = _client(engine)
    chat = _item("c", text=None, messages=({"role": "system", "content": "s"},), endpoint="chat")
    assert client.complete(chat).cached_tokens == 8
    client.complete_many([_item("a"), _item("b")])
    assert seen[0][0] == "/v1/chat/completions" and seen[0][1]["messages"][0]["content"] == "s"
    assert seen[1][0] == "/v1/completions" and seen[1][1]["prompt"] == ["text a", "text b"]


@pytest.mark.parametrize(("probe_s", "ok"), [(0.0, True), (0.3, False)])
def test_without_cached_tokens_a_prefix_must_answer_faster_after_priming(probe_s, ok):
    from tasks.adapters.targets import apply_items, verify_items

    delays = [0.3, probe_s]

    def llamacpp(request):  # reports no cached_tokens, as llama.cpp's server does
        import time

        time.sleep(delays.pop(0))
        return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": {"prompt_tokens": 9}})

    engine = EngineSettings(name="l", url="http://engine.test", model="m", kind="llamacpp")
    client = EngineClient(engine, retry=FAST, transport=httpx.MockTransport(llamacpp))
    ctx = BatchContext(None, client, WarmOptions(ttft_drop=0.3))  # type: ignore[arg-type]
    items = [_item("a")]
    results = apply_items(items, ctx)
    verify_items(items, results, ctx)
    assert results[0].ok is ok


def test_tenant_isolation_salts_every_request():
    bodies = []

    def engine(request):
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": {}})

    isolated = EngineSettings(name="e", url="http://engine.test", model="m", tenant_isolation=True)
    client = EngineClient(isolated, retry=FAST, transport=httpx.MockTransport(engine))
    client.complete(_item("a", tenant="acme"))
    client.complete_many([_item("b", tenant="zeta"), _item("c", tenant="zeta")])
    _client(engine).complete(_item("d", tenant="acme"))
    assert [b.get("cache_salt") for b in bodies] == ["acme", "zeta", None]


def _accounting_engine(cached_on_probe: int, kind: str = "simulator", queries: float | None = None):
    """An engine that reports cached tokens: 0 on a first sight of a prompt, then
    ``cached_on_probe``; with ``queries``, its /metrics count that many prefix-cache lookups.
    Returns its client and the list of completion requests it saw."""
    seen: list[dict] = []
    primed: set[str] = set()

    def engine(request):
        if request.url.path == "/metrics":
            if queries is None:
                return httpx.Response(404)
            text = ("# TYPE vllm:prefix_cache_queries counter\n"
                    f'vllm:prefix_cache_queries_total{{engine="0"}} {queries}\n')  # fmt: skip
            return httpx.Response(200, text=text)
        body = json.loads(request.content)
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        seen.append(body)
        cached = sum(cached_on_probe if p in primed else 0 for p in prompts)
        primed.update(prompts)
        usage = {"prompt_tokens": 300 * len(prompts),
                 "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
        return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": usage})

    settings = EngineSettings(name="s", url="http://engine.test", model="m", kind=kind)
    return EngineClient(settings, retry=FAST, transport=httpx.MockTransport(engine)), seen


@pytest.mark.parametrize("chat", [False, True])
def test_where_the_prime_reports_cached_tokens_and_the_cache_counts_lookups_one_request_each(chat):
    from tasks.adapters.targets import apply_items, verify_items

    client, seen = _accounting_engine(cached_on_probe=256, queries=1200.0)
    ctx = BatchContext(None, client, WarmOptions(prompts_per_request=1))  # type: ignore[arg-type]
    items = [_item(k, tokens=300, **({"params": {"add_special_tokens": False}} if chat else {}))
             for k in "abcd"]  # fmt: skip
    results = apply_items(items, ctx)
    verify_items(items, results, ctx)
    assert all(r.ok for r in results) and [r.verified_by for r in results] == ["prime"] * 4
    assert len(seen) == len(items)  # the primes, nothing more


@pytest.mark.parametrize("chat", [False, True])
def test_where_the_prime_reports_cached_tokens_one_sampled_probe_per_batch(chat):
    from tasks.adapters.targets import apply_items, verify_items

    client, seen = _accounting_engine(cached_on_probe=256)
    ctx = BatchContext(None, client, WarmOptions(prompts_per_request=1))  # type: ignore[arg-type]
    items = [_item(k, tokens=300, **({"params": {"add_special_tokens": False}} if chat else {}))
             for k in "abcd"]  # fmt: skip
    results = apply_items(items, ctx)
    verify_items(items, results, ctx)
    assert all(r.ok for r in results)
    assert len(seen) == len(items) + 1  # one prime each, one probe for the batch
    assert seen[-1]["prompt"] == items[-1].text  # the sample is the item primed last
    assert [r.verified_by for r in results] == ["prime", "prime", "prime", "probe"]


def test_a_sample_that_finds_nothing_cached_has_every_item_probed_and_failed():
    from tasks.adapters.targets import apply_items, verify_items

    # prefix caching switched off: no lookups counted, nothing ever cached
    client, seen = _accounting_engine(cached_on_probe=0, queries=0.0)
    ctx = BatchContext(None, client, WarmOptions(prompts_per_request=1))  # type: ignore[arg-type]
    items = [_item(k, tokens=300) for k in "abc"]
    results = apply_items(items, ctx)
    verify_items(items, results, ctx)
    assert [r.ok for r in results] == [False, False, False]
    assert len(seen) == 3 + 3  # primes, the sample, then the other two probed alone


VLLM_METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 2816.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-llama"} 1408.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny-llama"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny-llama"} 3.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny-llama"} 3.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",enable_prefix_caching="True",num_gpu_blocks="64"} 1.0
vllm:prefix_cache_queries_total_other{engine="1"} 7.0
"""


def test_metric_samples_come_from_the_wanted_lines_only():
    from tasks.adapters.engine_client import samples_from_text

    queries = samples_from_text(VLLM_METRICS, frozenset({"vllm:prefix_cache_queries_total"}))
    assert queries == [("vllm:prefix_cache_queries_total",
                        {"engine": "0", "model_name": "tiny-llama"}, 2816.0)]  # fmt: skip
    (config,) = samples_from_text(VLLM_METRICS, frozenset({"vllm:cache_config_info"}))
    assert config[1]["num_gpu_blocks"] == "64" and config[2] == 1.0
    assert samples_from_text(VLLM_METRICS, frozenset({"vllm:absent_total"})) == []
    assert samples_from_text("<html>not metrics</html>", frozenset({"<html>"})) == []
