"""Chat traffic logged by an engine is warmed so that a chat user's next request finds its
prompt's head cached: ingest the simulator's vLLM-format log, plan, warm through a real worker,
then ask as a new chat user."""

from __future__ import annotations

import httpx
import pytest

from jobs.simulator import SimulatorConfig, SimulatorServer
from pipeline.ingest import ingest_to_dir
from tasks.services.planning import plan_for, plan_request, read_records
from tasks.warm_tasks import submit_plan, wait_plan
from tests.integration.warm.conftest import MODEL

pytestmark = pytest.mark.integration
SYSTEMS = {team: f"You are the {team} desk. Cite the {team} policy, answer in two lines. " * 12
           for team in ("billing", "travel", "legal")}  # fmt: skip
USES = {"billing": 3, "travel": 2, "legal": 1}  # legal's template is seen once


def _chat(client: httpx.Client, team: str, user: str) -> dict:
    body = {"model": MODEL, "max_tokens": 2, "temperature": 0.0,
            "messages": [{"role": "system", "content": SYSTEMS[team]},
                         {"role": "user", "content": user}]}  # fmt: skip
    response = client.post("/v1/chat/completions", json=body)
    response.raise_for_status()
    return response.json()["usage"]


def test_a_chat_users_prompt_head_is_what_was_primed(
    sim, warm_settings, warm_worker, warm_queue, tmp_path
):
    log = tmp_path / "history.log"
    with SimulatorServer(SimulatorConfig(model=MODEL, log_file=log)) as history:
        client = httpx.Client(base_url=history.url, timeout=30)
        for team, uses in USES.items():
            for n in range(uses):
                _chat(client, team, f"Question {n} from {team}: where is my order {n}?")
        client.close()
    ingest_to_dir([log], tmp_path / "ingest")
    records, _ = read_records(tmp_path / "ingest")
    assert set(records["endpoint"].dropna()) == {"/v1/chat/completions"}
    engine = warm_settings.engine("sim")
    request = plan_request(warm_settings, "sim")
    plan = plan_for(records, request, engine=engine)
    assert len(plan.items) == 3  # one per template, the one seen once included
    sim.engine.reset_prefix_cache()  # the restart: nothing cached
    plan_id = submit_plan(plan, settings=warm_settings, queue=warm_queue)
    assert wait_plan(plan_id, 60, settings=warm_settings)["items_ok"] == 3
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        for team in USES:
            usage = _chat(client, team, "A new user asks something nobody asked before?")
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            # all of the system message and the chat template around it, up to the user's words
            assert cached >= usage["prompt_tokens"] - 32, (team, usage)
