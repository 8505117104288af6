"""A real vLLM CPU server as a current fleet runs it: INFO logs, no request logging, KV events.

It is :class:`benchmarks.engines.engine.VllmServer` with two changes: no ``--enable-log-requests``
and ``VLLM_LOGGING_LEVEL=INFO`` (so no prompt and no token id reaches its log), and
``--kv-events-config`` publishing the KV-cache event stream on a ZMQ PUB socket with a ROUTER
replay socket. Behind ``vllm-router`` (0.1.17) it also needs ``--enable-scale-out``
(``scale_out``): the router's prefix-aware policies (``cache_aware``, ``kv_aware``) tokenize
each request through the replica's ``/v1/chat/completions/render`` or
``/v1/completions/render``, which vLLM 0.32 answers 403 without it; the router then has no
tokens for chats and text prompts and routes them by load alone (its
``vllm_router_prefix_routing_decisions_total{outcome="missing_tokens"}``).
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
    scale_out: bool = False  # --enable-scale-out: the render endpoints a router tokenizes with

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
        cmd += ["--kv-events-config", self.kv_events_config()]
        return [*cmd, "--enable-scale-out"] if self.scale_out else cmd

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env["VLLM_LOGGING_LEVEL"] = "INFO"
        return env
