"""A replica that logs no prompts (vLLM at INFO) is observed and planned for from its KV events:
the closed windows' KV-event counts its ``prewarm kv-events`` follower wrote become windows of
the loop's observations (once each), and the chains its events showed held become candidates,
primed with their token ids on the simulator."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from jobs.simulator import SimulatorConfig, SimulatorServer
from pipeline.kv_events import BlockStored, EventBatch
from pipeline.kv_holdings import ReplicaHoldings
from tasks.adapters.kv_state import append_counts, save_holdings
from tasks.services.loop import WarmLoop
from tasks.settings import EngineSettings, KvEventSourceSettings, ScheduleSettings, Settings
from tests.integration.test_loop import in_process

pytestmark = pytest.mark.integration

BLOCK = 16
WINDOW_S = 60


def _stored(hashes: list[int], parent: int | None, first: int) -> BlockStored:
    ids = list(range(first, first + BLOCK * len(hashes)))
    return BlockStored(hashes, parent, ids, BLOCK, None, "GPU", None, None)


def _follower_wrote(data_dir: Path, engine: str) -> None:
    """What a follower writes after three windows of a head of 4 blocks used by 6 requests,
    each with a block of its own after it."""
    holdings = ReplicaHoldings(engine, window_s=WINDOW_S)
    holdings.apply(EventBatch(1.0, [_stored([1, 2, 3, 4], None, 0)]))
    for n in range(6):  # a request whose head is cached publishes only its own block
        holdings.apply(EventBatch(5.0 + n * 30, [_stored([100 + n], 4, 1000 + 100 * n)]))
    append_counts(data_dir, engine, holdings.take_counts(before_ts=3 * WINDOW_S))
    save_holdings(data_dir, holdings, None)


def test_an_info_only_replica_learns_from_its_kv_events(tmp_path, store, store_url):
    with SimulatorServer(SimulatorConfig(block_size=BLOCK)) as sim:
        engine = EngineSettings(name="kv", url=sim.url, model="sim-llm", kind="simulator",
                                cache_tokens=8192, cache_block_tokens=BLOCK)  # fmt: skip
        events = KvEventSourceSettings(engine="kv", endpoint="tcp://127.0.0.1:9")
        settings = Settings(
            redis_url=store_url, store_url=store_url, data_dir=tmp_path, engines=(engine,),
            sources=(events,), schedule=ScheduleSettings(window_s=WINDOW_S),
        )  # fmt: skip
        _follower_wrote(tmp_path, "kv")
        loop = WarmLoop(settings, store, submit=in_process(store, settings))
        outcome = loop.warm_now("kv", "window")
        assert outcome["status"] == "submitted", outcome
        assert outcome["observations"]["windows"] == 3  # the follower's closed windows
        assert outcome["observations"]["records"] == 0  # no prompt was ever logged
        again = loop.warm_now("kv", "window")
        assert again["observations"]["windows"] == 3  # each window is taken once
        assert again["observations"]["version"] == outcome["observations"]["version"]
        body = {"model": "sim-llm", "prompt": list(range(0, 4 * BLOCK)) + [7] * 20,
                "max_tokens": 1}  # fmt: skip
        usage = httpx.post(f"{sim.url}/v1/completions", json=body).json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= 4 * BLOCK  # the head, primed
