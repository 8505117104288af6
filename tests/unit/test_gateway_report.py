"""The gateway's cache hit rate: counted per window from its request log, kept as metrics and
history, and shown in the report before and after each warm-up."""

from __future__ import annotations

import pandas as pd
import pytest

from jobs.report import ReportData, before_after, gateway_share, render, totals
from pipeline.gateway_answers import cache_answers
from pipeline.records import records_frame
from tasks.adapters import telemetry


def _records(rows: list[tuple[float, bool | None]]) -> pd.DataFrame:
    return records_frame([{"ts": pd.Timestamp(ts, unit="s", tz="UTC"), "source": "gateway",
                           "cache_hit": hit} for ts, hit in rows])  # fmt: skip


def test_answers_are_counted_per_window_and_unknown_ones_left_out():
    records = _records([(600, True), (650, False), (700, None), (1250, True), (1300, True)])
    assert cache_answers(records, 600) == [(600.0, 2, 1), (1200.0, 2, 2)]
    assert cache_answers(_records([(600, None)]), 600) == []
    assert cache_answers(records_frame([]), 600) == []


def _event(kind: str, ts: float, **data) -> dict:
    return {"kind": kind, "ts": ts, **data}


def test_the_report_shows_the_gateways_share_before_and_after_each_warm_up():
    events = [
        _event("gateway", 0, requests=10, hits=8, read=1),
        _event("gateway", 60, requests=10, hits=0, read=61),  # the gateway's cache was emptied
        _event("plan", 100, reason="window", items=5, plan="p"),
        _event("gateway", 120, requests=20, hits=19, read=130),
        _event("gateway", 120, requests=5, hits=5, read=170),  # the same window, read again
    ]
    data = ReportData.from_events("e", 0, 300, events)
    [row] = before_after(data)
    assert row["gateway_before"] == pytest.approx(8 / 20)
    assert row["gateway_after"] == pytest.approx(24 / 25)
    assert totals(data)["gateway_hit_rate"] == pytest.approx(32 / 45)
    assert gateway_share([]) is None
    page = render(data, now=300)
    assert "gateway cache before" in page and "40.0%" in page and "96.0%" in page


@pytest.mark.integration
def test_the_gateways_answers_are_metrics_and_history(store):
    telemetry.record_gateway(store, "e", [(600.0, 4, 1), (1200.0, 6, 6)], now=1300.0)
    telemetry.record_gateway(store, "e", [(1200.0, 6, 6)], now=1400.0)  # same counts, new read
    series = telemetry.read_series(store)
    assert series["prewarm_gateway_requests_total"] == [(("e",), 16.0)]
    assert series["prewarm_gateway_cache_hits_total"] == [(("e",), 13.0)]
    assert series["prewarm_gateway_cache_hit_ratio"] == [(("e",), 1.0)]  # the last read's
    events = [e for e in telemetry.history(store, "e", 0, 2000) if e["kind"] == "gateway"]
    assert sorted((e["ts"], e["requests"], e["hits"]) for e in events) == [
        (600.0, 4, 1), (1200.0, 6, 6), (1200.0, 6, 6)
    ]  # fmt: skip


def test_a_semantic_gateways_intents_are_shown_before_and_in_the_last_window():
    from jobs.report import intent_shares
    from pipeline.intents.requests import IntentRequest, intent_windows

    def asked(ts: float, hit: bool | None) -> IntentRequest:
        return IntentRequest(ts, "chat", "q", "{}", {}, hit)

    requests = [asked(0, False), asked(10, True), asked(70, True), asked(80, None), asked(5, True)]
    windows = intent_windows("edge", requests, ["a", "a", "a", "a", "b"],
                             {"a": "How do I reset my password?"}, 60)  # fmt: skip
    assert [(w.intent, w.start, w.requests, w.hits) for w in windows] == [
        ("a", 0.0, 2, 1), ("a", 60.0, 1, 1), ("b", 0.0, 1, 1)]  # fmt: skip
    events = [_event("intent", w.start, **w.to_dict(), read=1) for w in windows]
    data = ReportData.from_events("e", 0, 300, events)
    rows = intent_shares(data)
    assert [(r["label"], r["requests"], r["before"], r["after"]) for r in rows] == [
        ("How do I reset my password?", 3, 0.5, 1.0), ("b", 1, 1.0, None)]  # fmt: skip
    page = render(data, now=300)
    assert "each intent answered from the cache" in page and "reset my password" in page
    assert "each intent answered" not in render(ReportData.from_events("e", 0, 300, []), 300)
