"""From records to a plan: candidates of every kind, the learned forecast when history allows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from models.forecaster import SAVED_NAME, HotnessForecaster
from models.persistence import save_model
from pipeline.errors import BadInputError
from pipeline.evaluation import CountMatrix
from pipeline.ingest import ingest_to_dir
from pipeline.ingest.options import IngestOptions
from pipeline.keys import CacheKey
from pipeline.planner.candidates import (
    PlanRequest,
    TemplateHead,
    candidates,
    plan_from_candidates,
    plan_from_records,
    template_head_items,
)
from pipeline.planner.plan import PlanBudget
from pipeline.prefix_blocks import block_hashes
from pipeline.records import records_frame
from pipeline.windows import item_window_counts
from tasks.services.planning import plan_for, plan_request, read_records
from tasks.settings import Settings
from tests.conftest import SHARED_DATA

EXAMPLES = SHARED_DATA / "logs" / "examples"

HEADS = [f"You are the assistant of the {team} team; answer briefly and cite policy. " * 6
         for team in ("billing", "search", "legal", "travel")]  # fmt: skip


def _records(windows: int = 12, per_window: int = 20) -> pd.DataFrame:
    start, rows = pd.Timestamp("2026-01-01T00:00:00Z"), []
    for w in range(windows):
        for n in range(per_window):
            head = HEADS[0] if n % 2 else HEADS[1 + n % 3]
            rows.append({
                "ts": start + pd.Timedelta(minutes=10 * w, seconds=n), "model": "m",
                "prompt": head + f"Q{w}-{n}?", "temperature": 0.0 if n < 4 else 0.7,
                "max_tokens": 64, "adapter": "lora-a" if n == 0 else None, "prompt_tokens": 100,
                "output_tokens": 20,
            })  # fmt: skip
    rows += [{"ts": start, "model": "m", "prompt": "What is the refund window?", "temperature": 0.0,
              "max_tokens": 64} for _ in range(3)]  # fmt: skip
    return records_frame(rows)


def test_candidates_of_every_kind_fit_the_budget():
    request = PlanRequest(engine="e", model="m", budget=PlanBudget(max_items=50), shapes=True)
    plan = plan_from_records(_records(), request)
    kinds = {item.kind for item in plan.items}
    assert kinds == {"prefix", "adapter", "shape"}  # responses are a gateway's (extra)
    prefixes = [i for i in plan.items if i.kind == "prefix"]
    assert len(prefixes) == 4 and prefixes[-1].text.startswith(HEADS[0][:30])  # hottest last


def _with_windows(tmp_path) -> tuple[pd.DataFrame, Path, PlanRequest]:
    """Records with prefix hashes, their window counts on disk, and a plain plan request."""
    records = _records()
    records["prefix_hashes"] = records["prompt"].map(block_hashes)
    windows = tmp_path / "windows.parquet"
    item_window_counts(records).to_parquet(windows)
    settings = Settings.model_validate(
        {"engines": [{"name": "e", "url": "http://x", "model": "m"}]}
    )
    return records, windows, plan_request(settings, "e")


def test_learned_forecast_is_used_when_the_windows_allow(tmp_path):
    records, windows, request = _with_windows(tmp_path)
    learned = plan_for(records, request, windows=windows, forecast="auto")
    assert "forecast: model (fitted)" in learned.notes
    assert learned.items[-1].text.startswith(HEADS[0][:30])
    frequency = plan_for(records, request, windows=windows, forecast="frequency")
    assert "forecast: frequency" in frequency.notes
    short = plan_for(records[records["ts"] < records["ts"].min() + pd.Timedelta(minutes=30)],
                            request, windows=None)  # fmt: skip
    assert "forecast: frequency" in short.notes


def test_a_saved_forecaster_is_preferred_and_an_unusable_one_is_refitted(tmp_path):
    records, windows, request = _with_windows(tmp_path)
    models = tmp_path / "models"
    counts = CountMatrix.from_counts(pd.read_parquet(windows), kind="prefix")
    save_model(HotnessForecaster().fit(counts), models, SAVED_NAME)  # what retrain saves
    saved = plan_for(records, request, windows=windows, forecast="auto", models_root=models)
    assert "forecast: model (saved)" in saved.notes
    assert saved.items[-1].text.startswith(HEADS[0][:30])
    metadata = next(models.glob("hotness/*/metadata.json"))
    metadata.write_text(metadata.read_text().replace('"code_version"', '"code_version_was"'))
    refitted = plan_for(records, request, windows=windows, forecast="auto", models_root=models)
    assert "forecast: model (fitted)" in refitted.notes


def _templates(uses: dict[str, int]) -> pd.DataFrame:
    start, rows = pd.Timestamp("2026-01-01T00:00:00Z"), []
    for n, (team, count) in enumerate(uses.items()):
        head = f"You are the assistant of the {team} team; follow the {team} policy. " * 40
        rows += [{"ts": start + pd.Timedelta(seconds=10 * n + k), "model": "m",
                  "prompt": head + f"Question {k} from {team}?"} for k in range(count)]  # fmt: skip
    return records_frame(rows)


def test_a_cache_with_room_warms_a_twice_seen_prefix():
    records = _templates({"billing": 2, "search": 3, "legal": 9})
    request = PlanRequest(engine="e", model="m", budget=PlanBudget(max_tokens=100_000))
    plan = plan_from_records(records, request)
    assert len([i for i in plan.items if i.kind == "prefix"]) == 3
    assert plan.items[-1].text.startswith("You are the assistant of the legal team")


def test_a_budget_in_real_tokens_never_overfills():
    uses = {team: 2 + n for n, team in enumerate(("a", "b", "c", "d", "e", "f", "g", "h"))}
    records = _templates(uses)
    request = PlanRequest(engine="e", model="m", budget=PlanBudget(max_tokens=1))
    found = candidates(records, request)
    # the engine counts 1.6 real tokens per estimated one; half the items are measured
    measured = {i.key: int(i.tokens * 1.6) + 3 for i in found[::2]}
    estimates = {i.key: i.tokens for i in found}
    estimated = sum(estimates.values())
    for budget in (estimated // 4, estimated // 2, estimated):
        request = PlanRequest(engine="e", model="m", budget=PlanBudget(max_tokens=budget))
        plan = plan_from_records(records, request, token_counts=measured)
        for item in plan.items:  # measured counts as measured, the rest scaled by the ratio
            assert item.tokens == measured.get(item.key, item.tokens) >= 1.6 * estimates[item.key]
        assert plan.tokens <= budget and len(plan.items) >= 1


def test_a_vllm_cache_with_a_block_size_loses_the_null_block_to_the_budget():
    engine = {"name": "e", "url": "http://x", "model": "m", "cache_tokens": 8192}
    plain = Settings.model_validate({"engines": [engine]})
    assert plan_request(plain, "e").budget.max_tokens == 8192
    blocks = Settings.model_validate({"engines": [{**engine, "cache_block_tokens": 128}]})
    budget = plan_request(blocks, "e").budget
    assert budget.max_tokens == 8192 - 128 and budget.block_tokens == 128
    simulator = Settings.model_validate(
        {"engines": [{**engine, "cache_block_tokens": 16, "kind": "simulator"}]}
    )
    assert plan_request(simulator, "e").budget.max_tokens == 8192


def _tree_records() -> pd.DataFrame:
    """Three templates behind one short shared header: 'billing' used 6 times (twice with the
    same long question), 'search' 3 times, 'legal' once."""
    start, rows = pd.Timestamp("2026-01-01T00:00:00Z"), []
    header = "Answer as the desk assistant of the company, politely and briefly, and never guess. "
    repeated = "Which invoices are overdue this month and by how many days each? " * 4
    users = {"billing": [f"Q{k}?" for k in range(4)] + [repeated, repeated],
             "search": [f"Q{k}?" for k in range(3)], "legal": ["Q0?"]}  # fmt: skip
    for team, questions in users.items():
        head = header + f"You are the assistant of the {team} team; follow its policy. " * 30
        rows += [{"ts": start + pd.Timedelta(seconds=len(rows)), "model": "m", "prompt": head + q}
                 for q in questions]  # fmt: skip
    return records_frame(rows)


def test_a_longer_prefix_replaces_its_parent_which_is_credited():
    request = PlanRequest(engine="e", model="m",
                          budget=PlanBudget(max_tokens=100_000, block_tokens=16))  # fmt: skip
    found = candidates(_tree_records(), request)
    parents = {i.key for i in found if i.parent is not None and i.parent in {f.key for f in found}}
    assert parents, "the repeated question is a child of the billing head"
    plan = plan_from_candidates(found, request)
    billing = [i for i in plan.items if "billing" in (i.text or "")]
    assert len(billing) == 1 and billing[0].text.endswith("days each? ")  # one chain, primed once
    head = next(i for i in found if i.key == billing[0].parent)
    assert billing[0].predicted_hits >= head.predicted_hits > 0  # credited with the head's hits
    # the shared header (a block here) and the billing head, both warmed by the question's prime
    assert "prefix chains: 2 shorter prefixes credited to a longer one" in plan.notes
    assert not [i for i in plan.items if i.key == head.parent]
    assert plan.notes[0] == "reason: cli"


def test_with_room_everything_seen_is_primed_and_nothing_uncacheable():
    request = PlanRequest(engine="e", model="m",
                          budget=PlanBudget(max_tokens=100_000, block_tokens=64))  # fmt: skip
    plan = plan_from_records(_tree_records(), request)
    teams = [next(t for t in ("billing", "search", "legal") if t in (i.text or ""))
             for i in plan.items]  # fmt: skip
    assert teams == ["legal", "search", "billing"]  # seen once included; hottest primed last
    assert all(request.budget.cached_tokens(i) > 0 for i in plan.items)
    assert "uncacheable: 1 prefixes shorter than one cache block" in plan.notes  # the header


def test_blocks_shared_along_a_chain_are_counted_once():
    header = "Answer as the desk assistant of the company, politely and briefly, and never guess. "
    shared = header * 12  # a long header every template starts with
    rows = [{"ts": "2026-01-01T00:00:00Z", "model": "m", "prompt": shared + f"{team} team. " * 40
             + f"Q{k}?"} for team in ("billing", "search") for k in range(3)]  # fmt: skip
    roomy = PlanRequest(engine="e", model="m", budget=PlanBudget(block_tokens=16))
    plan = plan_from_records(records_frame(rows), roomy)
    assert len(plan.items) == 2  # one per template; the header is credited, not primed
    whole = sum(roomy.budget.cache_tokens(i) for i in plan.items)
    header_tokens = roomy.budget.cache_tokens(
        next(i for i in candidates(records_frame(rows), roomy) if i.parent is None)
    )
    # a budget that holds both templates only if their shared header is counted once
    exact = PlanBudget(max_tokens=whole - header_tokens + 16, block_tokens=16)
    tight = plan_from_records(records_frame(rows), PlanRequest(engine="e", model="m", budget=exact))
    assert len(tight.items) == 2


def test_when_the_cache_is_short_the_forecast_decides_what_is_cut():
    roomy = PlanRequest(engine="e", model="m", budget=PlanBudget(block_tokens=64))
    sizes = [roomy.budget.cache_tokens(i) for i in plan_from_records(_tree_records(), roomy).items]
    tight = PlanRequest(
        engine="e", model="m", budget=PlanBudget(max_tokens=sizes[-1] + sizes[-2], block_tokens=64)
    )
    plan = plan_from_records(_tree_records(), tight)
    assert [("legal" in (i.text or "")) for i in plan.items] == [False, False]
    assert sum(tight.budget.cache_tokens(i) for i in plan.items) <= tight.budget.max_tokens


def test_every_reason_goes_through_the_one_planner():
    records = _tree_records()
    for reason in ("window", "replica", "trigger", "cli", "demo"):
        request = PlanRequest(engine="e", model="m", reason=reason)
        plan = plan_from_candidates(candidates(records, request), request)
        assert plan.notes[0] == f"reason: {reason}" and plan.items
        assert any(i.kind == "shape" for i in plan.items) == (reason == "replica")
    heads = [TemplateHead("billing@2", HEADS[0], hotness=3.0, endpoints=("completions", "chat"))]
    request = PlanRequest(engine="e", model="m", reason="template")
    plan = plan_from_candidates(
        candidates(records, request, extra=template_head_items(heads, "m")), request
    )
    assert plan.notes[0] == "reason: template" and len(plan.items) == 2  # nothing from records
    chat = next(i for i in plan.items if i.endpoint == "chat")
    assert chat.messages == ({"role": "system", "content": HEADS[0]},)
    assert CacheKey.parse(chat.key).template == "billing@2"
    with pytest.raises(BadInputError, match="reason"):
        PlanRequest(engine="e", reason="whim")


def test_missing_values_never_become_nan_in_keys_or_crash_shapes():
    rows = [{"ts": "2026-01-01T00:00:00Z", "model": "m", "prompt": "What is the refund window?",
             "temperature": 0.0, "max_tokens": 64} for _ in range(3)]  # fmt: skip
    records = records_frame(rows).astype({"prompt_tokens": "float64", "tenant": "object"})
    records["tenant"] = float("nan")  # how a column of missing values reads back from parquet
    records["max_tokens"] = 64.0
    request = PlanRequest(engine="e", model="m", shapes=True)
    found = candidates(records, request)
    assert {i.kind for i in found} >= {"shape"}
    assert not [i.key for i in found if "nan" in i.key.lower()]


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.iterdir()))
def test_plan_with_shapes_works_on_every_example_log(example, tmp_path):
    ingest_to_dir([EXAMPLES / example], tmp_path / "ingest", IngestOptions(year=2025))
    records, _ = read_records(tmp_path / "ingest")
    request = PlanRequest(engine="e", shapes=True)
    plan = plan_from_records(records, request)
    assert not [i.key for i in plan.items if "nan" in i.key.split(":")]
    assert plan.notes[0] == "reason: cli"


def _two_shapes() -> pd.DataFrame:
    """Chat-like requests (short prompt, long answer) and batch-like (long prompt, 1 token)."""
    start, rows = pd.Timestamp("2026-01-01T00:00:00Z"), []
    for n in range(80):
        chat = n % 2 == 0
        rows.append({"ts": start + pd.Timedelta(seconds=n), "model": "m",
                     "request_id": f"r{n}", "prompt": ("hi there " if chat else HEADS[1]) + f"{n}",
                     "prompt_tokens": 20 + n % 5 if chat else 3000 + n,
                     "output_tokens": 400 + n if chat else 1})  # fmt: skip
    return records_frame(rows)


def test_a_replica_plan_has_one_shape_per_workload_profile():
    settings = Settings.model_validate(
        {"engines": [{"name": "e", "url": "http://x", "model": "m"}]}
    )
    request = plan_request(settings, "e", reason="replica")
    plan = plan_for(_two_shapes(), request)
    shapes = [i for i in plan.items if i.kind == "shape"]
    assert plan.notes[0] == "reason: replica"
    profiles = next(n for n in plan.notes if n.startswith("shapes:"))
    assert profiles.startswith("shapes: ") and "workload profiles" in profiles, plan.notes
    assert len(shapes) == int(profiles.split()[1]) >= 2
    assert {i.params["max_tokens"] for i in shapes} >= {16, 512}  # both shapes kept
    few = plan_for(_two_shapes()[:10], request)
    assert "shapes: length buckets (too few requests to profile)" in few.notes


VLLM_METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_cpu_blocks="None",num_gpu_blocks="64",num_gpu_blocks_override="64"} 1.0
"""  # noqa: E501 - one line as vLLM 0.32 writes it


def test_block_size_and_capacity_come_from_the_engine_when_not_configured():
    import httpx

    from tasks.services.planning import engine_cache, with_engine_cache

    settings = Settings.model_validate(
        {"engines": [{"name": "e", "url": "http://x", "model": "m", "kind": "vllm"}]}
    )
    engine = settings.engine("e")
    vllm = httpx.MockTransport(lambda r: httpx.Response(200, text=VLLM_METRICS))
    assert engine_cache(engine, vllm) == (128, 64)
    other = httpx.MockTransport(lambda r: httpx.Response(404))
    assert engine_cache(engine, other) is None
    request, note = with_engine_cache(plan_request(settings, "e"), (128, 64))
    assert request.budget.block_tokens == 128 and request.budget.max_tokens == 63 * 128
    assert note == "cache: 64 blocks of 128 tokens (the engine's /metrics)"
    # a header shorter than the engine's block is then never planned
    plan = plan_from_records(_tree_records(), request)
    assert "uncacheable: 1 prefixes shorter than one cache block" in plan.notes


def test_a_configured_capacity_larger_than_the_engines_cache_is_cut_to_the_engine():
    from tasks.services.planning import with_engine_cache

    settings = Settings.model_validate(
        {"engines": [{"name": "e", "url": "http://x", "model": "m", "kind": "vllm",
                      "cache_tokens": 64 * 128 * 8, "cache_block_tokens": 128}]}
    )  # fmt: skip
    request, note = with_engine_cache(plan_request(settings, "e"), (128, 64))
    assert request.budget.max_tokens == 63 * 128
    assert "smaller than the 65408 tokens configured: the plan is cut to the engine's 8064" in note
    # a setting below the engine's cache stays the cap
    small = Settings.model_validate(
        {"engines": [{"name": "e", "url": "http://x", "model": "m", "kind": "vllm",
                      "cache_tokens": 1024, "cache_block_tokens": 128}]}
    )  # fmt: skip
    request, note = with_engine_cache(plan_request(small, "e"), (128, 64))
    assert request.budget.max_tokens == 1024 - 128 and "cut" not in note
