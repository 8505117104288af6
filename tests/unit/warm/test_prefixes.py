"""Shared-prefix detection from records."""

from __future__ import annotations

import pandas as pd

from pipeline.prefix_blocks import prefix_chain
from pipeline.records import records_frame
from pipeline.shared_prefixes import (
    detect_prefixes,
    frequency_forecast,
    frequency_hits,
    history_rate,
    prefix_items,
)

SYSTEM = "You are a careful assistant for the billing team. " * 8
OTHER = "Translate the following support ticket into plain English please. " * 6


def _records(prompts, tenant="t1", start="2026-01-01T00:00:00Z", step_s=60):
    ts = pd.Timestamp(start)
    rows = [
        {
            "ts": ts + pd.Timedelta(seconds=i * step_s),
            "prompt": p,
            "model": "m",
            "tenant": tenant,
            "endpoint": "completions",
        }
        for i, p in enumerate(prompts)
    ]
    return records_frame(rows)


def test_finds_the_shared_heads_where_the_prompts_diverge():
    prompts = [SYSTEM + f"Question {n}: why is invoice {n * 7} late?" for n in range(6)]
    prompts += [OTHER + f"Ticket {n} says the app crashed on {n} screens" for n in range(3)]
    lonely = "a lonely prompt that nobody else shares with anything at all " * 3
    found = detect_prefixes(_records([*prompts, lonely]))
    assert [p.count for p in found] == [6, 3, 1]
    head = found[0]
    # the head runs to the character where its prompts part, past the detector's last block
    assert head.text == SYSTEM + "Question "
    assert len(head.text) > max(b.end for b in prefix_chain(SYSTEM))
    assert head.tokens >= 64 and head.parent is None
    # seen once and sharing nothing: the whole prompt is its own prefix (what a replay sends)
    assert found[2].text == lonely and found[2].count == 1


def test_nested_prefixes_are_one_chain_counted_through():
    repeated = (
        SYSTEM + "Question: which invoices are overdue this month, and by how many days? " * 3
    )
    prompts = [SYSTEM + f"Question {n}: why is invoice {n * 7} late?" for n in range(4)]
    found = detect_prefixes(_records([*prompts, repeated, repeated]))
    by_count = {p.count: p for p in found}
    assert sorted(by_count) == [2, 6]
    head, question = by_count[6], by_count[2]
    assert question.parent == head.key and head.parent is None
    assert question.text == repeated and question.text.startswith(head.text)


def test_a_header_too_short_to_cache_does_not_hide_a_template_seen_once():
    # shared by everything, one detector block (16 pseudo-tokens), shorter than a cache block
    header = "Answer as the desk assistant of the company, politely and briefly, and never guess. "
    prompts = [header + SYSTEM + f"q{n} " * 3 for n in range(3)] + [header + OTHER + "once?"]
    found = detect_prefixes(_records(prompts), min_tokens=32)
    texts = {p.count: p for p in found if p.tokens >= 32}
    assert texts[1].text == header + OTHER + "once?"  # its own prefix: nothing longer is shared
    assert texts[3].text.startswith(header + SYSTEM)
    short = [p for p in found if p.tokens < 32]
    assert [p.count for p in short] == [4] and short[0].parent is None


def test_counts_per_window_and_frequency_forecast():
    prompts = [SYSTEM + f"q{n} " * 3 for n in range(8)]
    found = detect_prefixes(_records(prompts, step_s=100), window_s=300)
    windows = found[0].windows
    assert sum(windows.values()) == 8 and len(windows) == 3
    assert frequency_forecast({0: 4, 1: 0, 2: 4}, alpha=0.5) == 0.5 * 4 + 0.25 * 0 + 0.125 * 4
    items = prefix_items(found)
    assert items[0].kind == "prefix" and items[0].predicted_hits > 0
    assert items[0].next_use_s is not None


def test_tenants_are_separate_items():
    prompts = [SYSTEM + f"q{n} " * 3 for n in range(3)]
    frame = pd.concat([_records(prompts, "a"), _records(prompts, "b")], ignore_index=True)
    found = detect_prefixes(frame)
    assert sorted(p.tenant for p in found) == ["a", "b"]


def test_chat_records_keep_their_system_messages():
    frame = _records([None] * 4)
    frame["endpoint"] = "chat"
    frame["messages"] = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"hi {n}"}]
        for n in range(4)
    ]
    found = detect_prefixes(frame)
    assert len(found) == 1 and found[0].messages == ({"role": "system", "content": SYSTEM},)
    item = prefix_items(found)[0]
    assert item.endpoint == "chat" and item.messages is not None


def test_rendered_chat_prompts_skip_the_second_bos():
    prompts = ["<s>[SYS] " + SYSTEM + f"[USER] q{n} " * 3 for n in range(3)]
    frame = _records(prompts)
    frame["endpoint"] = "/v1/chat/completions"  # as vLLM's request ids name it
    item = prefix_items(detect_prefixes(frame))[0]
    assert item.endpoint == "completions" and item.params == {"add_special_tokens": False}


def test_prefixes_carry_the_workload_profile_of_their_requests():
    prompts = [SYSTEM + f"q{n} " * 3 for n in range(5)] + [OTHER + f"t{n} " * 3 for n in range(2)]
    frame = _records(prompts)
    frame["profile"] = ["chat"] * 4 + ["batch"] + ["batch"] * 2
    items = {i.text[:10]: i for i in prefix_items(detect_prefixes(frame))}
    assert items[SYSTEM[:10]].profile == "chat" and items[OTHER[:10]].profile == "batch"


def test_every_item_is_measured_over_the_same_history():
    # seen twice long ago against twice lately, over the same ten windows: lately ranks first
    early, late = frequency_hits({0: 2}, span=(0, 9)), frequency_hits({9: 2}, span=(0, 9))
    assert late > early > 0
    assert history_rate({0: 2}, span=(0, 9)) == history_rate({9: 2}, span=(0, 9)) == 0.2


def test_a_prefix_seen_in_history_is_never_forecast_at_zero():
    assert history_rate({0: 2, 5: 1}) == 3 / 6
    # two requests in one window: the EWMA alone says 1.0; the history rate says 2
    assert frequency_hits({0: 2}) == 0.5 * 1.0 + 0.5 * 2.0
    # an early burst long ago still predicts some reuse
    assert frequency_hits({0: 3, 20: 0}) > 0
    prompts = [SYSTEM + f"q{n} " * 3 for n in range(2)]
    found = detect_prefixes(_records(prompts))
    learned = prefix_items(found, forecast={found[0].key: 0.0})
    assert learned[0].predicted_hits > 0  # a learned 0 is floored for a prefix seen
