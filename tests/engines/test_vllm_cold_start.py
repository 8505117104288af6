"""Real vLLM CPU engine: after a restart, prewarm's warm-up serves first uses from the cache.

Marked ``vllm``: not part of the default suite. Run it with
``PREWARM_TEST_REDIS_DB=12 python -m pytest -m vllm tests/engines`` on a machine with the vLLM
venv (``PREWARM_VLLM_PYTHON``) and the locally built model (``PREWARM_VLLM_MODEL``); without
them it skips with the reason. Takes 3-5 minutes (three engine starts).

Every template the history used at least twice (what shared-prefix detection can see) must be
served from cache on its first use; the control (no warm-up) serves none. Hits are read from
``usage.prompt_tokens_details.cached_tokens`` (exact); timings are left to
``benchmarks/engines/vllm_cold_start.py``.
"""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.engines.engine import missing_prerequisites

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(1800)]
#: History uses from which a template is a shared prefix (one use is no sharing): with room in
#: the cache, every such prefix has expected hits and is warmed.
HOT_USES = 2


@pytest.fixture
def engine_ready(broker_url: str) -> None:
    reason = missing_prerequisites()
    if reason:
        pytest.skip(reason)


def test_prewarm_serves_first_uses_from_cache_after_restart(engine_ready, tmp_path):
    from benchmarks.engines.vllm_cold_start import run_setting, token_counter
    from benchmarks.engines.workload import build_workload

    workload = build_workload(token_counter(), n_templates=6, n_history=24, n_future=12, seed=1)
    result = run_setting("fits", tmp_path, workload, ("none", "prewarm"))
    arms = {arm["arm"]: arm for arm in result["arms"]}

    # The control: a restarted engine has nothing cached for any template's first request.
    assert arms["none"]["first_uses"] > 0
    assert arms["none"]["first_use_hits"] == 0
    # Templates the history shared must be warm on first use; one seen once cannot be told apart
    # from a unique prompt and may stay cold.
    used = Counter(request.template for request in workload.history)
    firsts = [workload.future[p].template for p in workload.first_uses()]
    hot = [n for n, template in enumerate(firsts) if used[template] >= HOT_USES]
    hits = arms["prewarm"]["first_use_hit_flags"]
    assert hot, "the workload has no hot template in both history and future"
    assert [hits[n] for n in hot] == [True] * len(hot), arms["prewarm"]
