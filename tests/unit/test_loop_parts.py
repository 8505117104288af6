"""The loop's parts that need no server: settings (sources, reload), observations on disk,
the detectors' saved state, the key registry."""

from __future__ import annotations

import os
import time

import pandas as pd
import pytest

from pipeline.errors import SettingsError
from pipeline.triggers import EngineSample
from tasks.adapters import redis_keys
from tasks.adapters.observations import Observations, merge_counts
from tasks.services.replica_watch import EngineDetectors
from tasks.settings import current_settings, load_settings

ENGINE = '[[engines]]\nname = "{name}"\nurl = "http://127.0.0.1:1"\nmodel = "m"\n'


def test_a_source_names_a_configured_engine_and_a_known_kind(tmp_path):
    config = tmp_path / "p.toml"
    config.write_text(ENGINE.format(name="a") + '[[sources]]\nengine = "b"\nkind = "vllm-log"\n'
                      'path = "x.log"\n')  # fmt: skip
    with pytest.raises(SettingsError, match="engine 'b' is not configured"):
        load_settings({}, config)
    config.write_text(ENGINE.format(name="a") + '[[sources]]\nengine = "a"\nkind = "syslog"\n'
                      'path = "x.log"\n')  # fmt: skip
    with pytest.raises(SettingsError, match="unknown source kind 'syslog'"):
        load_settings({}, config)


def test_current_settings_follow_the_file_when_it_changes(tmp_path, monkeypatch):
    config = tmp_path / "p.toml"
    config.write_text(ENGINE.format(name="a"))
    monkeypatch.setenv("PREWARM_CONFIG", str(config))
    current_settings.cache_clear()
    try:
        assert [e.name for e in current_settings().engines] == ["a"]
        assert current_settings() is current_settings()  # unchanged file: read once
        config.write_text(ENGINE.format(name="a") + ENGINE.format(name="b"))
        stamp = time.time() + 5
        os.utime(config, (stamp, stamp))
        assert [e.name for e in current_settings().engines] == ["a", "b"]
    finally:
        current_settings.cache_clear()


def _counts(window: str, key: str, requests: int) -> pd.DataFrame:
    return pd.DataFrame({
        "item_kind": ["prefix"], "item_key": [key],
        "window_start": [pd.Timestamp(window, tz="UTC")], "requests": [requests],
        "prompt_tokens": [10 * requests], "output_tokens": [requests],
    })  # fmt: skip


def test_a_window_read_over_two_ticks_is_summed_and_old_windows_are_dropped(tmp_path):
    merged = merge_counts(_counts("2026-01-01 00:00", "k", 2), _counts("2026-01-01 00:00", "k", 3))
    assert merged is not None and merged["requests"].tolist() == [5]
    observations = Observations(tmp_path, "e/1")  # a name that is not a safe path part
    records = pd.DataFrame({"prompt": [f"p{n}" for n in range(5)]})
    for n in range(4):
        snapshot = observations.append(
            records, _counts(f"2026-01-01 00:0{n}", "k", 1), keep_records=7, keep_windows=2
        )
    version = snapshot.version
    assert version.version == 4 and version.windows == 2 and version.records == 7
    assert observations.folder.parent == tmp_path / "observations"
    kept = observations.counts()
    assert kept is not None and kept["window_start"].min() == pd.Timestamp("2026-01-01 00:02Z")


def test_detector_state_survives_a_round_trip_through_json():
    detectors = EngineDetectors()
    for n in range(3):
        detectors.observe(EngineSample("e", float(n), prefix_queries=100.0 * n,
                                       prefix_hits=90.0 * n, requests=10.0 * n,
                                       ttft_buckets=((0.1, n), (float("inf"), n))))  # fmt: skip
    again = EngineDetectors.from_json(detectors.to_json())
    assert again.hit_rate.baseline == detectors.hit_rate.baseline
    assert again.previous == detectors.previous and list(again.spike.history) == [10.0, 10.0]
    assert EngineDetectors.from_json(None).previous is None


def test_every_store_key_comes_from_one_registry():
    names = [v for k, v in vars(redis_keys).items() if k.isupper() and isinstance(v, str)]
    assert all(name.startswith(redis_keys.ROOT) for name in names)
    import pathlib

    tasks_dir = pathlib.Path(redis_keys.__file__).parent
    spelled = [p.name for p in tasks_dir.rglob("*.py") if p.name != "redis_keys.py"
               and ('"prewarm:' in p.read_text() or '"pw:' in p.read_text())]  # fmt: skip
    # warm_batch.py still spells the WAL transaction key (the same string as WAL_TXN)
    assert set(spelled) <= {"warm_batch.py"}
