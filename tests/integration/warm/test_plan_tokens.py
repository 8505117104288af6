"""Token counts for budgeting come from the engine's tokenizer (the simulator's ``/tokenize``)."""

from __future__ import annotations

import socket

import httpx

from jobs.simulator import SimulatorServer
from pipeline.planner.plan import WarmItem
from tasks.services.planning import measure_tokens
from tasks.settings import EngineSettings

SYSTEM = "You are a careful assistant for the billing team; cite the policy. "


def _items() -> list[WarmItem]:
    chat = ({"role": "system", "content": SYSTEM * 3},)
    return [
        WarmItem("prefix", "t", "sim-llm", text=SYSTEM * 5),
        WarmItem("prefix", "c", "sim-llm", messages=chat, endpoint="chat"),
        WarmItem("adapter", "adapter:a", "sim-llm", adapter="a"),
    ]


def test_counts_are_the_engines_own(sim: SimulatorServer):
    engine = EngineSettings(name="sim", url=sim.url, model="sim-llm", kind="simulator")
    counts = measure_tokens(_items(), engine)
    assert set(counts) == {"t", "c"}  # an adapter has no prompt to count
    direct = httpx.post(f"{sim.url}/tokenize", json={"model": "sim-llm", "prompt": SYSTEM * 5})
    assert counts["t"] == direct.json()["count"] > 0
    assert counts["c"] > 0


def _closed_port() -> int:
    with socket.socket() as sock:  # bound then closed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_engine_that_does_not_answer_leaves_the_estimates():
    url = f"http://127.0.0.1:{_closed_port()}"
    engine = EngineSettings(name="gone", url=url, model="sim-llm")
    assert measure_tokens(_items(), engine) == {}
