"""Real vLLM CPU engine: after a restart, prewarm's warm-up serves first uses from the cache.

Marked ``vllm``: not part of the default suite. Run it with
``PREWARM_TEST_REDIS_DB=12 python -m pytest -m vllm tests/engines`` on a machine with the vLLM
venv (``PREWARM_VLLM_PYTHON``) and the locally built model (``PREWARM_VLLM_MODEL``); without
them it skips with the reason. Takes 4-7 minutes (four engine starts).

With a cache that holds everything, every template the history used (a template seen once
included) must be served from cache on its first use; the control (no warm-up) serves none;
the hand-rolled replay (the newest logged prompt of each template re-sent) serves no more, and
costs the engine at least as many prompt tokens. Hits are read from
``usage.prompt_tokens_details.cached_tokens`` (exact), prompt tokens from the engine's
``/metrics``; timings are left to ``benchmarks/engines/vllm_cold_start.py``.
"""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.engines.engine import missing_prerequisites

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(1800)]


@pytest.fixture
def engine_ready(broker_url: str) -> None:
    reason = missing_prerequisites()
    if reason:
        pytest.skip(reason)


def test_prewarm_serves_first_uses_from_cache_after_restart(engine_ready, tmp_path):
    from benchmarks.engines.vllm_cold_start import run_setting, token_counter
    from benchmarks.engines.workload import build_workload

    workload = build_workload(token_counter(), n_templates=6, n_history=24, n_future=12, seed=1)
    result = run_setting("fits", tmp_path, workload, ("none", "prewarm", "replay_newest"))
    arms = {arm["arm"]: arm for arm in result["arms"]}

    # The control: a restarted engine has nothing cached for any template's first request.
    assert arms["none"]["first_uses"] > 0
    assert arms["none"]["first_use_hits"] == 0
    # Every template the history used is warm on first use, those seen once included.
    used = Counter(request.template for request in workload.history)
    firsts = [workload.future[p].template for p in workload.first_uses()]
    seen = [n for n, template in enumerate(firsts) if used[template] >= 1]
    hits = arms["prewarm"]["first_use_hit_flags"]
    assert seen and any(used[t] == 1 for t in used), "the workload needs a template seen once"
    assert [hits[n] for n in seen] == [True] * len(seen), arms["prewarm"]
    replay = arms["replay_newest"]
    assert arms["prewarm"]["first_use_hits"] >= replay["first_use_hits"]
    assert 0 < arms["prewarm"]["warm_prompt_tokens"] <= replay["warm_prompt_tokens"], arms
