"""Item × window counts and their features."""

from __future__ import annotations

import pandas as pd
import pytest

from pipeline.records import records_frame
from pipeline.window_features import window_features
from pipeline.windows import COUNT_DTYPES, item_window_counts, prompt_key

T0 = pd.Timestamp("2025-01-01T00:00:00Z")


def _records():
    rows = [
        {"ts": T0, "prefix_hashes": ["a", "b"], "prompt": "p1", "prompt_tokens": 10,
         "output_tokens": 2, "model": "m", "tenant": "t1", "adapter": "lora1"},
        {"ts": T0 + pd.Timedelta(minutes=3), "prefix_hashes": ["a", "c"], "prompt": "p2",
         "prompt_tokens": 20, "output_tokens": None, "model": "m"},
        {"ts": T0 + pd.Timedelta(minutes=25), "prefix_hashes": ["a"], "prompt": "p1",
         "prompt_tokens": 30, "output_tokens": 5, "model": "m", "tenant": "t1"},
    ]  # fmt: skip
    return records_frame(rows)


def test_counts_shape_and_prefix_chain_counting():
    counts = item_window_counts(_records(), "10min")
    assert {c: str(t) for c, t in counts.dtypes.items()} == {
        c: str(pd.Series(dtype=t).dtype) for c, t in COUNT_DTYPES.items()
    }
    key = counts.set_index(["item_kind", "item_key", "window_start"])
    assert key.loc[("prefix", "a", T0), "requests"] == 2
    assert key.loc[("prefix", "a", T0), "prompt_tokens"] == 30
    assert key.loc[("prefix", "a", T0), "output_tokens"] == 2
    assert key.loc[("prefix", "b", T0), "requests"] == 1
    assert key.loc[("prompt", prompt_key("p1"), T0 + pd.Timedelta(minutes=20)), "requests"] == 1
    assert key.loc[("tenant", "t1", T0), "requests"] == 1
    assert key.loc[("adapter", "lora1", T0), "requests"] == 1
    assert key.loc[("model", "m", T0), "requests"] == 2
    assert (counts["requests"] > 0).all()


def test_features_lags_rolling_and_target_on_a_dense_grid():
    counts = item_window_counts(_records(), "10min")
    features = window_features(counts, lags=(1, 2), rolling=(2,), window="10min")
    a = features[(features.item_kind == "prefix") & (features.item_key == "a")]
    assert a["requests"].tolist() == [2, 0, 1]  # the empty middle window is filled
    assert a["lag_1"].tolist() == [0, 2, 0]
    assert a["lag_2"].tolist() == [0, 0, 2]
    assert a["roll_mean_2"].tolist() == pytest.approx([2.0, 1.0, 0.5])
    assert a["target_next"].tolist()[:2] == [0, 1]
    assert pd.isna(a["target_next"].iloc[-1])
    assert a["windows_since_seen"].tolist() == [0, 1, 0]
    b = features[(features.item_kind == "prefix") & (features.item_key == "b")]
    assert len(b) == 3  # from its first window to the last window of all


def test_min_total_requests_drops_rare_items():
    counts = item_window_counts(_records(), "10min")
    features = window_features(counts, window="10min", min_total_requests=2)
    assert set(features.loc[features.item_kind == "prefix", "item_key"]) == {"a"}


def test_empty_records_give_empty_counts():
    assert item_window_counts(records_frame([]), "10min").empty


def test_ingest_windows_keep_every_count_and_feature_the_frequent_items():
    from pipeline.ingest import windows_result
    from pipeline.records import records_frame as frame
    from pipeline.windows import item_window_counts as counts_of

    counts = counts_of(_records(), "10min")
    windows = windows_result(counts, "10min", min_item_requests=2)
    seen = windows[windows["requests"] > 0]
    merged = seen.merge(counts, on=["item_kind", "item_key", "window_start"], suffixes=("", "_c"))
    assert len(seen) == len(counts) == len(merged)
    assert (merged["requests"] == merged["requests_c"]).all()
    rare = windows[(windows.item_kind == "prefix") & (windows.item_key == "b")]
    assert rare["lag_1"].isna().all()  # seen once: no features
    frequent = windows[(windows.item_kind == "prefix") & (windows.item_key == "a")]
    assert frequent["lag_1"].tolist() == [0, 2, 0]
    assert windows_result(counts_of(frame([]), "10min"), "10min") is None


def test_timing_columns_carry_recency_tail_and_chain_position():
    counts = item_window_counts(_records(), "10min", timing=True)
    plain = item_window_counts(_records(), "10min")
    pd.testing.assert_frame_equal(counts[plain.columns], plain)  # additive only
    key = counts.set_index(["item_kind", "item_key", "window_start"])
    a, c = key.loc[("prefix", "a", T0)], key.loc[("prefix", "c", T0)]
    assert a["last_offset_s"] == 180.0  # its last request came 3 minutes into the window
    assert a["tail_requests"] == 0  # none in the last 2 minutes
    assert (a["chain_depth"], a["leaf_requests"]) == (0, 0)
    assert (c["chain_depth"], c["leaf_requests"]) == (1, 1)
    late = key.loc[("prefix", "a", T0 + pd.Timedelta(minutes=20))]
    assert (late["last_offset_s"], late["tail_requests"], late["leaf_requests"]) == (300.0, 0, 1)
    assert key.loc[("model", "m", T0), "chain_depth"] == 0


@pytest.mark.parametrize("min_requests", [1, 12])
@pytest.mark.parametrize("batch_rows", [1, 5, 10**9])
def test_windows_written_in_batches_of_whole_items_equal_those_made_at_once(
    tmp_path, monkeypatch, batch_rows, min_requests
):
    """write_windows (the CLI's bounded-memory path) gives windows_result's rows, in item
    order, however small its batches: features of an item never depend on the batch."""
    import numpy as np

    import pipeline.ingest as ingest
    from pipeline.ingest import IngestOptions, windows_result, write_windows
    from pipeline.ingest.sinks import counts_table

    rng = np.random.default_rng(7)
    rows = [
        {"item_kind": kind, "item_key": f"k{rng.integers(9)}",
         "window_start": T0 + pd.Timedelta(minutes=10 * int(rng.integers(40))),
         "requests": int(rng.integers(1, 5)), "prompt_tokens": 3, "output_tokens": 1}
        for kind in ("prefix", "template", "tenant") for _ in range(60)
    ]  # fmt: skip
    counts = pd.DataFrame(rows).astype(COUNT_DTYPES)
    counts = counts.groupby(["item_kind", "item_key", "window_start"], as_index=False).sum()
    counts = counts.astype(COUNT_DTYPES)
    monkeypatch.setattr(ingest, "FEATURE_BATCH_ROWS", batch_rows)
    options = IngestOptions(min_item_requests=min_requests)
    written = write_windows(counts_table(counts), tmp_path / "w.parquet", options)
    got = pd.read_parquet(tmp_path / "w.parquet")
    expected = windows_result(counts, options.window, options.min_item_requests)
    assert written == len(got) == len(expected)
    assert got["lag_1"].isna().any() == (min_requests > 1)  # rare rows: no features
    pd.testing.assert_frame_equal(got, expected)


def test_prompt_items_are_keyed_by_prompt_key_whatever_the_arrow_layout():
    import pyarrow as pa

    from pipeline.windows import _prompt_items

    texts = ["p1", None, "", "héllo \u4e16\u754c", "x" * 5000, None, "p1"]
    for kind in ("string", "string[pyarrow]"):
        prompts = pd.Series(texts, dtype=kind, index=range(10, 17))
        for part in (prompts, prompts.iloc[2:], prompts.iloc[2:5]):  # offsets into buffers
            items = _prompt_items(part)
            present = [t for t in part.tolist() if not pd.isna(t)]
            assert items.keys.to_pylist() == [prompt_key(t) for t in present]
            assert items.rows.tolist() == [i for i, t in enumerate(part) if not pd.isna(t)]
    large = pd.Series(pd.arrays.ArrowExtensionArray(pa.array(["a", None, "b"], pa.large_string())))
    assert _prompt_items(large).keys.to_pylist() == [prompt_key("a"), prompt_key("b")]


def test_counts_of_a_records_table_equal_those_of_its_frame():
    """The finishing step counts a piece from its records table (no frame): the same rows."""
    from pipeline.ingest.sinks import records_table
    from pipeline.windows import records_window_counts, window_counts_table

    rows = [
        *_records().to_dict("records"),
        {"ts": None, "prompt": "no time", "prefix_hashes": ["a"], "model": "m"},
        {"ts": T0 + pd.Timedelta(minutes=-7), "prompt": None, "prefix_hashes": None,
         "prompt_tokens": None, "output_tokens": 4, "adapter": "lora2"},
        {"ts": T0 + pd.Timedelta(seconds=599, microseconds=999_999), "prompt": "",
         "prefix_hashes": [], "tenant": "t2"},
    ]  # fmt: skip
    frame = records_frame(rows)
    keys = [("item_kind", "ascending"), ("item_key", "ascending"), ("window_start", "ascending")]
    for part in (frame, frame.iloc[3:], frame.iloc[:0]):
        for window in ("10min", "7min", "1h"):
            expected = window_counts_table(part, window, ordered=False).sort_by(keys)
            got = records_window_counts(records_table(part), window).sort_by(keys)
            assert got.equals(expected)
