"""A real vLLM CPU server as a current fleet runs it: INFO logs, no request logging, KV events.

It is :class:`benchmarks.engines.engine.VllmServer` with two changes: no ``--enable-log-requests``
and ``VLLM_LOGGING_LEVEL=INFO`` (so no prompt and no token id reaches its log), and
``--kv-events-config`` publishing the KV-cache event stream on a ZMQ PUB socket with a ROUTER
replay socket.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from benchmarks.engines.engine import VllmServer

#: Business words: prompts made of them tokenize like prose.
WORDS = [
    "account",
    "balance",
    "cache",
    "client",
    "contract",
    "customer",
    "data",
    "delivery",
    "document",
    "engine",
    "invoice",
    "ledger",
    "message",
    "order",
    "payment",
    "policy",
    "price",
    "product",
    "query",
    "report",
    "request",
    "review",
    "schedule",
    "service",
    "summary",
    "supplier",
    "system",
    "table",
    "task",
    "template",
    "tenant",
    "ticket",
    "token",
    "update",
    "user",
    "value",
    "vendor",
]


def prose(rng: random.Random, n: int) -> str:
    """``n`` random business words, space-separated."""
    return " ".join(rng.choices(WORDS, k=n))


@dataclass
class KvEventsVllmServer(VllmServer):
    """vLLM publishing KV-cache events on ``events_port`` (replay on ``replay_port``)."""

    events_port: int = 0
    replay_port: int = 0

    @property
    def events_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.events_port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def kv_events_config(self) -> str:
        return json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": f"tcp://*:{self.events_port}",
            "replay_endpoint": f"tcp://*:{self.replay_port}",
        })  # fmt: skip

    def command(self) -> list[str]:
        cmd = [arg for arg in super().command() if arg != "--enable-log-requests"]
        return [*cmd, "--kv-events-config", self.kv_events_config()]

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env["VLLM_LOGGING_LEVEL"] = "INFO"
        return env
