"""Golden tests: every example of FORMATS.md, and the spec-only variants in tests/data/ingest,
parse with no unexplained rejects and the right values in the fields their format carries."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from pipeline.ingest import IngestOptions, ingest_paths
from pipeline.prefix_blocks import block_hashes
from tests.conftest import SHARED_DATA

EXAMPLES = SHARED_DATA / "logs" / "examples"
SPEC_ONLY = Path(__file__).resolve().parents[2] / "data" / "ingest"
ALL_FILES = sorted(EXAMPLES.iterdir()) + sorted(SPEC_ONLY.iterdir())
EXPECTED_FORMAT = {"vllm": "vllm", "tgi-json": "tgi-json", "tgi-text": "tgi-text",
                   "litellm": "litellm-jsonl"}  # fmt: skip


def _one(path: Path, **options):
    result = ingest_paths([path], IngestOptions(**options))
    assert len(result.summary) == 1
    return result, result.summary[0]


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.name)
def test_every_example_parses_without_rejects(path):
    result, summary = _one(path)
    expected = next(f for prefix, f in EXPECTED_FORMAT.items() if path.name.startswith(prefix))
    assert summary.format == expected
    assert summary.rejects.total == 0, summary.rejects.sample_lines()
    assert summary.records == len(result.records) > 0
    assert result.records["ts"].notna().all()
    explained = set(summary.ignored) <= {
        "access line (joined by id only)", "error line", "input debug line (joined)",
        "output/token debug line", "launcher or other line",
    }  # fmt: skip
    assert explained, summary.ignored


def _by_id(records: pd.DataFrame) -> pd.DataFrame:
    return records.dropna(subset=["request_id"]).set_index("request_id")


def test_vllm_v04_received_finished_aborted_and_stats():
    result, summary = _one(EXAMPLES / "vllm-v0.4.txt", year=2024)
    rec = _by_id(result.records)
    first = rec.loc["cmpl-6c2f0b3c9d3e4a7f8b1a2c4d5e6f7a8b-0"]
    assert first["ts"] == pd.Timestamp("2024-05-06 14:21:07", tz="UTC")
    assert first["prompt"] == "San Francisco is a"
    assert not first["prompt_truncated"]
    assert (first["temperature"], first["top_k"], first["max_tokens"]) == (0.0, -1, 7)
    assert first["endpoint"] == "/v1/completions" and first["status"] == "ok"
    chat = rec.loc["cmpl-0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a"]
    assert chat["prompt"] == "<s>[INST] What's the capital of France? [/INST]"
    assert (chat["temperature"], chat["max_tokens"], chat["status"]) == (0.7, 4079, "ok")
    assert rec.loc["cmpl-a1b2c3d4e5f60718293a4b5c6d7e8f90", "status"] == "aborted"
    assert rec.loc["cmpl-a1b2c3d4e5f60718293a4b5c6d7e8f90", "top_p"] == 0.95
    rejected = result.records[result.records["request_id"].isna()]
    assert rejected["status"].tolist() == ["rejected"]  # the uvicorn 400 line
    assert rejected["endpoint"].tolist() == ["/v1/chat/completions"]
    metrics = result.metrics
    assert metrics["throughput"].tolist() == [17.8, 0.0]
    assert metrics["kv_usage"].iloc[0] == pytest.approx(0.004)
    assert metrics["running"].iloc[0] == 1
    assert "year 2024 given" in " ".join(summary.assumptions)


def test_vllm_v08_chat_ids_none_and_guided_decoding():
    result, _ = _one(EXAMPLES / "vllm-v0.8.txt", year=2025)
    rec = _by_id(result.records)
    chat = rec.loc["chatcmpl-b654b653c8714431a1096a3be88f1662"]
    assert chat["prompt"].startswith("<|im_start|>system\nYou are Qwen")
    assert pd.isna(chat["prompt_tokens"])  # V1 chat logs no token ids
    assert (chat["temperature"], chat["top_p"], chat["top_k"], chat["max_tokens"]) == (
        0.7, 0.8, 20, 32738
    )  # fmt: skip
    assert chat["prefix_hashes"] == block_hashes(chat["prompt"], 16)
    completion = rec.loc["cmpl-1f0e3dad99084e0c8bd0c4bb7e9a2f13-0"]
    assert completion["prompt"] == "Review: the battery died after two days. Sentiment:"
    assert completion["max_tokens"] == 5
    assert rec.loc["chatcmpl-7d1f8e3a9b2c4d5e6f708192a3b4c5d6", "status"] == "aborted"
    assert result.metrics["prefix_cache_hit_rate"].tolist() == pytest.approx([0.286, 0.286])
    assert result.records["status"].value_counts()["rejected"] == 1  # Error with model + 404


def test_vllm_v011_ansi_tag_outputs_streaming_and_abort():
    result, _ = _one(EXAMPLES / "vllm-v0.11.txt", year=2025)
    rec = _by_id(result.records)
    done = rec.loc["chatcmpl-3c59dc048e8850243be8079a5c74d079"]
    assert done["output_tokens"] == 8 and done["status"] == "ok"
    assert done["prompt"].endswith("What is the capital of France?<|eot_id|>"
                                   "<|start_header_id|>assistant<|end_header_id|>\n\n")  # fmt: skip
    streamed = rec.loc["chatcmpl-b6d767d2f8ed5d21a44b0e5886680cb9"]
    assert streamed["output_tokens"] == 1 + 1 + 1 + 3  # the streaming deltas' ids
    assert streamed["status"] == "ok"
    none_prompt = rec.loc["cmpl-37693cfc748049e45d87b8c7d8b9aacd-0"]
    assert pd.isna(none_prompt["prompt"]) and none_prompt["prefix_hashes"] is None
    assert rec.loc["chatcmpl-e2c420d928d4bf8ce0ff2ec19b371514", "status"] == "aborted"
    assert result.metrics["instance"].iloc[0] == "vllm-v0.11.txt/Engine 000"
    assert result.metrics["prefix_cache_hit_rate"].iloc[0] == pytest.approx(0.412)


def test_vllm_main_2026_deferred_and_new_generated_form():
    result, _ = _one(EXAMPLES / "vllm-main-2026-08.txt", year=2026)
    rec = _by_id(result.records)
    assert rec.loc["chatcmpl-e4da3b7fbbce2345", "status"] == "ok"
    assert rec.loc["chatcmpl-e4da3b7fbbce2345", "max_tokens"] == 4096
    assert pd.isna(rec.loc["chatcmpl-e4da3b7fbbce2345", "prompt"])  # R10 INFO: no prompt
    assert rec.loc["cmpl-1679091c5a880faf-0", "status"] == "received"
    row = result.metrics.iloc[0]
    assert (row["running"], row["waiting"], row["deferred"]) == (24, 5, 2)
    assert row["kv_usage"] == pytest.approx(0.638) and row["throughput"] == 1520.3


def test_vllm_v06_spec_only_mq_engine_lora_and_prefix_rate_line():
    result, _ = _one(SPEC_ONLY / "vllm-v0.6.txt", year=2024)
    rec = _by_id(result.records)
    assert rec.loc["cmpl-aa11bb22cc33dd44ee55ff6677889900-0", "adapter"] == "sql-lora"
    assert rec.loc["cmpl-aa11bb22cc33dd44ee55ff6677889900-0", "status"] == "aborted"
    assert rec.loc["chat-5f1c2a9b8e7d4c3b2a1908f7e6d5c4b3", "prompt_tokens"] == 24
    metrics = result.metrics.iloc[0]
    assert metrics["waiting"] == 1  # V0 "Pending"
    assert metrics["prefix_cache_hit_rate"] == pytest.approx(0.375)


def test_vllm_max_log_len_is_detected_and_marked_not_guessed():
    result, summary = _one(SPEC_ONLY / "vllm-v0.6-max-log-len-40.txt")
    rec = _by_id(result.records)
    cut = rec.loc["chat-0123456789abcdef0123456789abcdef"]
    assert len(cut["prompt"]) == 40 and bool(cut["prompt_truncated"]) is True
    assert cut["prompt"] == "<s>[INST] What's the weather like in Par"
    assert pd.isna(cut["prompt_tokens"])  # the id list was cut too
    whole = rec.loc["cmpl-fedcba9876543210fedcba9876543210-0"]
    assert bool(whole["prompt_truncated"]) is False and whole["prompt_tokens"] == 3
    assert any("--max-log-len 40" in a for a in summary.assumptions)


def test_vllm_v063_guided_decoding_quirk():
    result, _ = _one(SPEC_ONLY / "vllm-v0.6.3-guided.txt")
    row = result.records.iloc[0]
    assert (row["seed"], row["max_tokens"], row["temperature"]) == (42, 128, 0.2)


def test_vllm_v015_debug_details_engine_suffix_and_failures():
    result, _ = _one(SPEC_ONLY / "vllm-v0.15-debug.txt", year=2026)
    rec = _by_id(result.records)
    chat = rec.loc["chatcmpl-a269fdcb7c6ce890"]
    assert (
        chat["prompt"] == "<|im_start|>user\nname three colours<|im_end|>\n<|im_start|>assistant\n"
    )
    assert rec.loc["cmpl-5e1d2c3b4a596877-0", "status"] == "aborted"  # via the -3f9c21d7 id
    assert rec.loc["chatcmpl-0b1c2d3e4f5a6b7c", "status"] == "rejected"
    assert len(rec) == 3  # suffixed engine ids joined, not extra records
    engine, aggregated = result.metrics.iloc[0], result.metrics.iloc[1]
    assert engine["preemptions"] == 2 and engine["mm_cache_hit_rate"] == pytest.approx(0.05)
    assert aggregated["running"] == 6 and aggregated["instance"].endswith("2 Engines Aggregated")


def test_vllm_old_templates_prefix_and_year_rollover():
    result, _ = _one(SPEC_ONLY / "vllm-old-templates.txt", year=2023)
    rec = _by_id(result.records)
    assert rec.loc["cmpl-r1", "ts"] == pd.Timestamp("2023-12-31 23:59:58", tz="UTC")
    assert rec.loc["cmpl-r2", "ts"] == pd.Timestamp("2024-01-01 00:00:01", tz="UTC")
    assert rec.loc["cmpl-r4", "prompt"] == "Third"  # behind a VLLM_LOGGING_PREFIX
    assert rec.loc["cmpl-r4", "status"] == "ok"
    assert rec.loc["cmpl-r2", "prompt_tokens"] == 2


def test_vllm_timezone_option_converts_to_utc():
    result, _ = _one(EXAMPLES / "vllm-v0.4.txt", year=2024, tz="Europe/Berlin")
    assert result.records["ts"].min() == pd.Timestamp("2024-05-06 12:21:07", tz="UTC")
    default_result, summary = _one(EXAMPLES / "vllm-v0.4.txt")
    assert "timezone UTC" in " ".join(summary.assumptions)
    assert (
        default_result.records["ts"].min().year
        == pd.Timestamp((EXAMPLES / "vllm-v0.4.txt").stat().st_mtime, unit="s").year
    )


def test_tgi_text_v3_success_params_adapter_and_errors():
    result, _ = _one(EXAMPLES / "tgi-text-v3.txt")
    rec = result.records
    first = rec.iloc[0]
    assert first["ts"] == pd.Timestamp("2025-06-03T09:41:17.052331Z") - pd.Timedelta(
        seconds=0.611294748
    ).round("us")
    assert first["endpoint"] == "/generate" and first["max_tokens"] == 20
    assert first["e2e_s"] == pytest.approx(0.611294748)
    assert first["queue_s"] == pytest.approx(127.337e-6)
    assert first["output_tokens"] == 20  # 610.405028ms / 30.520251ms
    stream = rec.iloc[1]
    assert (stream["temperature"], stream["top_p"], stream["max_tokens"]) == (0.7, 0.9, 512)
    assert pd.isna(stream["seed"])  # the client asked for none (`seed: None`) ...
    assert stream["seed_used"] == 5730125847162003291  # ... and the server drew this one
    adapter = rec[rec["adapter"].notna()]
    assert adapter["adapter"].tolist() == ["meta-llama/Llama-3.1-8B-Instruct"]
    assert rec["status"].tolist()[-4:] == ["rejected", "overloaded", "failed", "rejected"]
    assert (rec["source"] == "tgi").all()


def test_tgi_json_v3_matches_text_v3():
    text, _ = _one(EXAMPLES / "tgi-text-v3.txt")
    js, _ = _one(EXAMPLES / "tgi-json-v3.jsonl")
    columns = ["ts", "endpoint", "max_tokens", "seed", "seed_used", "output_tokens", "status",
               "adapter", "params_hash"]  # fmt: skip
    pd.testing.assert_frame_equal(text.records[columns], js.records[columns])


def test_tgi_text_v2_chat_without_parameters_and_u64_seed():
    result, _ = _one(EXAMPLES / "tgi-text-v2.txt")
    rec = result.records
    assert rec.iloc[0]["top_k"] == 10 and rec.iloc[0]["temperature"] == 0.5
    assert rec.iloc[3]["seed_used"] == 17260921448817315329  # a u64 above 2**63, kept exactly
    assert rec.iloc[2]["endpoint"] == "/v1/chat/completions"
    assert pd.isna(rec.iloc[2]["max_tokens"])


def test_tgi_debug_input_multiline_joined_to_success():
    result, _ = _one(EXAMPLES / "tgi-text-v3-debug.txt")
    row = result.records.iloc[0]
    assert row["prompt"].startswith(
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    )
    assert "What is the capital of France?" in row["prompt"]
    assert row["prompt"].endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert row["prefix_hashes"] == block_hashes(row["prompt"], 16)
    assert row["output_tokens"] == 8


def test_tgi_v1_http_span_and_request_inputs_in_error_spans():
    result, _ = _one(SPEC_ONLY / "tgi-text-v1.txt")
    rec = result.records
    assert rec["status"].tolist() == ["ok", "ok", "rejected", "overloaded"]
    assert rec.iloc[2]["prompt"] == 'My "quoted" prompt: {braces}\n'
    assert rec.iloc[1]["seed_used"] == 7 and rec.iloc[1]["endpoint"] == "/"
    assert rec["seed"].isna().all()  # no client sent one
    js, summary = _one(SPEC_ONLY / "tgi-json-v1.jsonl")
    assert js.records["endpoint"].tolist() == ["/generate", "/generate_stream"]
    assert js.records.iloc[1]["seed_used"] == 3 and js.records.iloc[1]["output_tokens"] == 10
    assert summary.ignored["launcher or other line"] == 1


def test_tgi_ansi_and_json_debug_spec_variants():
    ansi, _ = _one(SPEC_ONLY / "tgi-text-v3-ansi.txt")
    assert ansi.records["adapter"].tolist()[0] == "my-lora"
    assert ansi.records["status"].tolist() == ["ok", "overloaded"]
    debug, _ = _one(SPEC_ONLY / "tgi-json-v3-debug.jsonl")
    assert debug.records.iloc[0]["prompt"].endswith("Ping?<|eot_id|>assistant\n\n")
