"""From records to a plan: candidates of every kind, the learned forecast when history allows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from models.forecaster import SAVED_NAME, HotnessForecaster
from models.persistence import save_model
from pipeline.evaluation import CountMatrix
from pipeline.keys import CacheKey
from pipeline.plan import PlanBudget
from pipeline.planning import PlanRequest, candidates, plan_from_records
from pipeline.prefix import block_hashes
from pipeline.records import records_frame
from pipeline.windows import item_window_counts
from tasks.settings import Settings
from tasks.warm_plan import plan_for_engine, plan_request

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
    request = PlanRequest(engine="e", model="m", budget=PlanBudget(max_items=50),
                          shapes=True, responses=True, embeddings=True)  # fmt: skip
    plan = plan_from_records(_records(), request)
    kinds = {item.kind for item in plan.items}
    assert kinds == {"prefix", "adapter", "shape", "response", "embedding"}
    response = next(i for i in plan.items if i.kind == "response")
    assert (
        response.text == "What is the refund window?"
        and CacheKey.parse(response.key).kind == "response"
    )
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
    learned = plan_for_engine(records, request, windows, forecast="auto")
    assert "forecast: model (fitted)" in learned.notes
    assert learned.items[-1].text.startswith(HEADS[0][:30])
    frequency = plan_for_engine(records, request, windows, forecast="frequency")
    assert "forecast: frequency" in frequency.notes
    short = plan_for_engine(records[records["ts"] < records["ts"].min() + pd.Timedelta(minutes=30)],
                            request, None)  # fmt: skip
    assert "forecast: frequency" in short.notes


def test_a_saved_forecaster_is_preferred_and_an_unusable_one_is_refitted(tmp_path):
    records, windows, request = _with_windows(tmp_path)
    models = tmp_path / "models"
    counts = CountMatrix.from_counts(pd.read_parquet(windows), kind="prefix")
    save_model(HotnessForecaster().fit(counts), models, SAVED_NAME)  # what retrain saves
    saved = plan_for_engine(records, request, windows, forecast="auto", models_root=models)
    assert "forecast: model (saved)" in saved.notes
    assert saved.items[-1].text.startswith(HEADS[0][:30])
    metadata = next(models.glob("hotness/*/metadata.json"))
    metadata.write_text(metadata.read_text().replace('"code_version"', '"code_version_was"'))
    refitted = plan_for_engine(records, request, windows, forecast="auto", models_root=models)
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
