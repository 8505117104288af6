"""The records a fleet's replica plans from: its own on a router that places by prefix; on a
spread one what every replica served, combined once per window for the window ticks (one read
of each replica's observations, one prefix detection) and afresh for any other warm-up."""

from __future__ import annotations

import pandas as pd

import pipeline.shared_prefixes as shared_prefixes
from pipeline.records import records_frame
from pipeline.shared_prefixes import DetectedOnce, detect_prefixes
from tasks.adapters.observations import Observations
from tasks.services.fleet_records import fleet_records
from tasks.settings import Settings
from tasks.settings.fleets import FleetSettings, ReplicaSettings

HEAD = "You answer questions about the billing rules of the shop, briefly and politely. " * 4
WINDOW = "2026-01-01T00:00:00+00:00"
NEXT_WINDOW = "2026-01-01T00:01:00+00:00"


def _settings(tmp_path, policy: str = "round_robin") -> Settings:
    fleet = FleetSettings(
        name="f", router_url="http://router:1", policy=policy, model="m",
        replicas=tuple(ReplicaSettings(url=f"http://replica-{n}:8000") for n in range(3)),
    )  # fmt: skip
    return Settings(data_dir=tmp_path, fleets=(fleet,))


def _observe(settings: Settings, engine: str, *questions: str) -> pd.DataFrame:
    rows = [{"ts": pd.Timestamp("2026-01-01", tz="UTC"), "prompt": HEAD + q, "model": "m",
             "tenant": "t", "endpoint": "completions"} for q in questions]  # fmt: skip
    new = records_frame(rows)
    snapshot = Observations(settings.data_dir, engine).append(new, None, 100, 8)
    assert snapshot.records is not None
    return snapshot.records


def _prompts(records: pd.DataFrame | None) -> list[str]:
    assert records is not None
    return sorted(p.removeprefix(HEAD) for p in records["prompt"])


def test_an_engine_of_no_fleet_and_a_prefix_placing_fleet_plan_from_their_own(tmp_path):
    settings = _settings(tmp_path, "cache_aware")
    a, b, _ = (e.name for e in settings.engines)
    own = _observe(settings, a, "q1")
    _observe(settings, b, "q2")
    taken = fleet_records(settings, settings.engine(a), own, WINDOW)
    assert taken.records is own and taken.note.endswith("this replica's own records")
    alone = settings.engine(a).model_copy(update={"fleet": None})
    for window in (WINDOW, None):
        taken = fleet_records(settings, alone, own, window)
        assert taken.records is own and taken.note == ""


def test_a_spread_fleets_window_ticks_share_one_combination_and_one_detection(
    tmp_path, monkeypatch
):
    settings = _settings(tmp_path)
    a, b, c = (settings.engine(e.name) for e in settings.engines)
    _observe(settings, a.name, "qa")
    _observe(settings, b.name, "qb")
    first = fleet_records(settings, a, None, WINDOW)
    assert _prompts(first.records) == ["qa", "qb"]
    assert "the records of all 3 replicas" in first.note
    # what c reads after the window's first plan joins the fleet's records at the next window
    own_c = _observe(settings, c.name, "qc")
    assert fleet_records(settings, c, own_c, WINDOW) is first
    assert fleet_records(settings, b, None, WINDOW) is first
    calls = []

    def counted(records, **params):
        calls.append(params)
        return detect_prefixes(records, **params)

    monkeypatch.setattr(shared_prefixes, "detect_prefixes", counted)
    found = [first.detect(first.records, min_count=2) for _ in range(3)]
    assert len(calls) == 1 and found[0] == found[1] == found[2] and found[0]
    assert _prompts(fleet_records(settings, c, own_c, NEXT_WINDOW).records) == ["qa", "qb", "qc"]


def test_another_warm_up_plans_from_every_replicas_newest_records(tmp_path):
    settings = _settings(tmp_path)
    a, b, c = (settings.engine(e.name) for e in settings.engines)
    _observe(settings, a.name, "qa")
    fleet_records(settings, a, None, WINDOW)  # a window's combination, made before b and c read
    _observe(settings, b.name, "qb")
    own_c = _observe(settings, c.name, "qc", "qc2")
    assert _prompts(fleet_records(settings, c, own_c, None).records) == ["qa", "qb", "qc", "qc2"]


def test_a_detection_once_detects_another_frame_and_other_parameters_anew():
    questions = [f"Question {n}: why was invoice number {n * 7919} charged twice this month?"
                 for n in range(4)]  # fmt: skip
    records = records_frame([{"prompt": HEAD + q, "model": "m"} for q in questions])
    once = DetectedOnce(records)
    shared = once(records, min_count=2)
    assert shared == detect_prefixes(records, min_count=2) and len(shared) == 1
    alone = once(records, min_count=5)  # no head seen 5 times: each prompt a prefix of its own
    assert alone == detect_prefixes(records, min_count=5) and len(alone) == 4
    other = records.head(1)
    assert once(other, min_count=2) == detect_prefixes(other, min_count=2)
    assert once(records, min_count=2) is not once(records, min_count=2)  # callers get a copy
