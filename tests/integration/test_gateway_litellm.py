"""The real LiteLLM proxy in front of the engine simulator, its Redis cache on, prewarm's callback
as the engine's source, and prewarm's loop on beat and a real Celery worker.

Clients send a workload through the proxy for a few windows: requests asked in every window
with deterministic parameters (temperature 0, or a fixed seed), one-off requests, sampled
requests asked again (temperature 0.8: no single answer), and embeddings whose inputs recur or
not. Then a deploy: the proxy restarts (LiteLLM keeps a copy of its entries in its process's
memory) and its Redis is emptied; with nothing typed the loop's next tick warms it. The next
window's clients then ask every recurring request and input once: each must be answered from
LiteLLM's cache on that first request, by LiteLLM's word (the ``x-litellm-cache-key`` header,
or ``cache_hit`` in its request log for an embedding). And no entry prewarm wrote goes unread:
the entries in the proxy's Redis after the warm-up are counted against the cache hits of that
window in the proxy's request log (a chat hit names its entry's key; an embeddings hit names
none, but each recurring input is asked once and only prewarm wrote since the deploy, so each
hit read one entry of prewarm's).

Marked ``slow``: 74-118 s here (two proxy starts of 12-26 s, three windows of traffic).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from jobs.embedded import WorkerProcess
from jobs.simulator import SimulatorConfig, SimulatorServer
from tasks.adapters.store import store_client
from tasks.settings import load_settings
from tests.conftest import worker_env
from tests.integration.litellm_proxy import (
    CacheRedis,
    LitellmProxy,
    gateway_settings,
    proxy_config,
    wait_for_tick_after,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOW_S = 6
NAMESPACE = "gw"
CHAT, EMBED = "sim-llm", "sim-embed"
TEAMS = ("billing", "claims", "travel", "legal", "payroll", "support")


def recurring_chats() -> list[dict]:
    """Requests asked in every window with one answer: greedy ones, and seeded ones."""
    bodies = [
        {"model": CHAT, "messages": [
            {"role": "system", "content": f"You answer for the {team} team. Be brief."},
            {"role": "user", "content": f"What is the {team} policy on question {n}?"}],
         "temperature": 0, "max_tokens": 8}
        for team in TEAMS for n in range(2)
    ]  # fmt: skip
    bodies += [{"model": CHAT, "messages": [{"role": "user", "content": f"Draft note {n}."}],
                "temperature": 0.7, "seed": 42, "max_tokens": 6} for n in range(3)]  # fmt: skip
    return bodies


RECURRING_INPUTS = [f"handbook section {n}: travel and expenses" for n in range(10)]


def one_off_chat(tag: str) -> dict:
    question = {"role": "user", "content": f"One question, asked once: {tag}"}
    return {"model": CHAT, "temperature": 0, "max_tokens": 8, "messages": [question]}


def sampled_chat(n: int) -> dict:
    return {"model": CHAT, "temperature": 0.8, "max_tokens": 8,
            "messages": [{"role": "user", "content": f"Write a slogan, idea {n}."}]}  # fmt: skip


def client_window(proxy: LitellmProxy, window: int) -> int:
    """One window of client traffic; how many requests it sent."""
    rid = lambda: f"client-{uuid.uuid4().hex}"  # noqa: E731  (a request id per request)
    for body in recurring_chats():
        proxy.post("/v1/chat/completions", body, rid())
    for n in range(4):
        proxy.post("/v1/chat/completions", one_off_chat(f"w{window}-{n}"), rid())
        proxy.post("/v1/chat/completions", sampled_chat(n), rid())
    for n in range(0, len(RECURRING_INPUTS), 2):  # two recurring inputs and a new one each
        inputs = [*RECURRING_INPUTS[n : n + 2], f"a one-off text {window}-{n}"]
        proxy.post("/v1/embeddings", {"model": EMBED, "input": inputs}, rid())
    return len(recurring_chats()) + 8 + len(RECURRING_INPUTS) // 2


def start_beat(folder: Path, env: dict[str, str]) -> subprocess.Popen:
    log = (folder / "beat.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-c", "from jobs.cli import main; main(['beat'])"],
        env=env, cwd=folder, stdout=log, stderr=log,
    )  # fmt: skip


def log_lines(path: Path) -> dict[str, dict]:
    """The proxy's request log by request id."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {line["request_id"]: line for line in lines}


@pytest.fixture
def stack(tmp_path, broker_url, store_url):
    cache = CacheRedis(tmp_path)
    sim = SimulatorServer(SimulatorConfig(log_file=tmp_path / "engine.log")).__enter__()
    log = tmp_path / "litellm-requests.jsonl"
    proxy = LitellmProxy(tmp_path, proxy_config(sim.url, [CHAT, EMBED], cache, NAMESPACE, 3600),
                         log)  # fmt: skip
    processes = []
    try:
        ready_s = proxy.wait_ready()
        config = gateway_settings(tmp_path / "prewarm.toml", tmp_path / "data", WINDOW_S, sim.url,
                                  proxy, cache.url(), f'namespace = "{NAMESPACE}"')  # fmt: skip
        env = worker_env({"PREWARM_CONFIG": str(config)})
        worker = WorkerProcess(config, tmp_path / "worker.log", env=env)
        processes.append(worker)
        worker.wait_ready()
        beats = [start_beat(tmp_path, env)]
        settings = load_settings(env)
        yield {"proxy": proxy, "cache": cache, "settings": settings, "ready_s": ready_s,
               "store": store_client(settings), "beats": beats, "env": env,
               "folder": tmp_path}  # fmt: skip
    finally:
        for beat in beats if processes else []:
            beat.terminate()
            beat.wait(20)
        for process in processes:
            process.stop()
        proxy.stop()
        sim.__exit__(None, None, None)
        cache.stop()


def test_the_loop_warms_an_emptied_gateway_cache_with_what_its_clients_repeat(stack):
    proxy, cache, store, settings = (
        stack["proxy"],
        stack["cache"],
        stack["store"],
        stack["settings"],
    )
    sent = 0
    for window in range(3):  # a few windows of clients, the loop ticking along
        sent += client_window(proxy, window)
        time.sleep(WINDOW_S - time.time() % WINDOW_S + 0.2)
    before = len(cache.entries(NAMESPACE))
    proxy.stop()  # a deploy: the proxy restarts and its Redis is emptied
    cache.client.flushall()
    restart_s = proxy.restart()
    tick = wait_for_tick_after(store, settings, time.time())
    stack["beats"][0].terminate()  # prewarm's warm-ups stop: what follows is the clients' window
    stack["beats"][0].wait(20)
    time.sleep(WINDOW_S)  # a tick beat sent before it stopped ends
    warmed = cache.entries(NAMESPACE)

    # the next window: every recurring request and input, once, plus new one-offs
    chats = recurring_chats()
    hits = []
    for body in chats:
        answer = proxy.post("/v1/chat/completions", body, f"next-{uuid.uuid4().hex}")
        hits.append(bool(answer.headers.get("x-litellm-cache-key")))
    ids = []
    for text in RECURRING_INPUTS:
        ids.append(f"next-{uuid.uuid4().hex}")
        proxy.post("/v1/embeddings", {"model": EMBED, "input": [text]}, ids[-1])
    proxy.post("/v1/chat/completions", one_off_chat("next"), f"next-{uuid.uuid4().hex}")
    sent += len(chats) + len(RECURRING_INPUTS) + 1
    time.sleep(1.0)  # the callback writes after each answer
    lines = log_lines(proxy.log_path)
    embed_hits = [bool(lines[i]["cache_hit"]) for i in ids if i in lines]
    read = {line["cache_key"] for rid, line in lines.items()
            if rid.startswith("next-") and line["cache_hit"] and line["cache_key"]}  # fmt: skip
    unread = len(warmed) - len(warmed & read) - sum(embed_hits)

    chat_share = sum(hits) / len(hits)
    embed_share = sum(embed_hits) / len(RECURRING_INPUTS)
    print(f"\nproxy ready in {stack['ready_s']:.1f}s, again in {restart_s:.1f}s after the "
          f"deploy; entries before the deploy {before}, "
          f"written by the warm-up {len(warmed)}; tick {tick.get('window')}: planned "
          f"{tick.get('planned')}, verified {tick.get('verified')}, failed {tick.get('failed')}; "
          f"first requests from the cache: chat {sum(hits)}/{len(hits)} = {chat_share:.2f}, "
          f"embeddings {sum(embed_hits)}/{len(RECURRING_INPUTS)} = {embed_share:.2f}; "
          f"entries never read in the next window: {unread}")  # fmt: skip
    assert chat_share >= 0.9 and embed_share >= 0.9
    assert warmed and unread == 0
    # one entry per recurring request and input: nothing for one-offs or sampled requests
    assert len(warmed) == len(chats) + len(RECURRING_INPUTS)
    assert tick["failed"] == 0

    # the loop reads that window too: /metrics and the report count the clients' requests
    # (prewarm's own warm-ups and checks left out) and the share its cache answered
    stack["beats"].append(start_beat(stack["folder"], stack["env"]))
    wait_for_tick_after(store, settings, time.time())
    from starlette.testclient import TestClient

    from jobs.api import build_api
    from jobs.report import load, totals

    with TestClient(build_api(settings)) as client:
        metrics = client.get("/metrics").text
    ratio = float(re.search(r'^prewarm_gateway_cache_hit_ratio\{engine="sim"\} (\S+)$', metrics,
                            re.M).group(1))  # fmt: skip
    summary = totals(load(store, "sim", 0, time.time()))
    print(f"gateway requests read {summary['gateway_requests']} of {sent} sent by clients; "
          f"answered from the cache over the run {summary['gateway_hit_rate']:.2f}; "
          f"at the last read {ratio:.2f}")  # fmt: skip
    assert summary["gateway_requests"] == sent
    assert ratio == pytest.approx((sum(hits) + sum(embed_hits)) / (len(chats) + len(ids) + 1))
