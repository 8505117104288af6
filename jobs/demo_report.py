"""The demo's printout: what was warmed, and time to first token before and after (SIMULATED)."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from jobs.demo_result import DemoResult
from jobs.demo_workload import DemoRequest, template_of


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def warmed_table(result: DemoResult, workload: list[DemoRequest]) -> Table:
    """The plan's items: which template each prefix belongs to, its size and forecast."""
    table = Table(title="Warmed (the plan learned from the simulator's log)")
    for column in ("template", "prefix key", "tokens", "forecast hits", "score (s saved)"):
        table.add_column(column)
    assert result.learned is not None
    for item in reversed(result.learned.plan.items):  # most valuable first
        name = template_of(item.text, workload)
        table.add_row(
            name, item.key, str(item.tokens), f"{item.predicted_hits:.1f}", f"{item.score:.2f}"
        )
    return table


def ttft_table(result: DemoResult) -> Table:
    """First request of each template: TTFT and cached tokens, cold vs after warming."""
    cold, warm = result.first_uses(result.cold), result.first_uses(result.warm)
    table = Table(title="Time to first token of each template's first request — SIMULATED")
    for column in ("template", "prompt tokens", "cold TTFT", "cached", "warmed TTFT", "cached "):
        table.add_column(column, justify="right")
    for name, before in cold.items():
        after = warm[name]
        table.add_row(
            name, str(before.prompt_tokens), _ms(before.ttft_s), str(before.cached_tokens),
            _ms(after.ttft_s), str(after.cached_tokens),
        )  # fmt: skip
    return table


def medians(result: DemoResult) -> tuple[float, float]:
    """Median first-use TTFT (seconds) before and after warming."""
    cold, warm = result.first_uses(result.cold), result.first_uses(result.warm)
    return (
        statistics.median(s.ttft_s for s in cold.values()),
        statistics.median(s.ttft_s for s in warm.values()),
    )


def print_result(result: DemoResult, workload: list[DemoRequest], console: Console) -> None:
    """Everything the demo measured, each latency marked as simulated."""
    learned = result.learned
    assert learned is not None
    prefixes = learned.counts[learned.counts["item_kind"] == "prefix"]
    console.print(
        f"\nIngested {learned.records} request records from the simulator's vLLM-format log "
        f"({learned.rejected} lines rejected); {prefixes['item_key'].nunique()} prefix blocks "
        f"counted; plan {learned.plan.plan_id}: {'; '.join(learned.plan.notes)}."
    )
    console.print(warmed_table(result, workload))
    report = result.report
    console.print(
        f"Warm-up through the Celery worker: {report.get('items_ok', 0)} items ok, "
        f"{report.get('items_failed', 0)} failed, {report.get('committed', 0)} batches committed, "
        f"{report.get('rolled_back', 0)} rolled back."
    )
    console.print(ttft_table(result))
    before, after = medians(result)
    console.print(
        f"[bold]SIMULATED[/bold] median time to first token of a template's first request: "
        f"{_ms(before)} cold → {_ms(after)} warmed ({before / max(after, 1e-9):.1f}× faster). "
        "Latencies come from the engine simulator's latency model, not a real engine."
    )
    console.print(f"Demo finished in {result.seconds:.1f} s.")


def result_json(result: DemoResult) -> dict[str, Any]:
    """The measurements as JSON (``prewarm demo --report-json``); latencies are simulated."""
    before, after = medians(result)
    learned = result.learned
    return {
        "simulated": True,
        "seconds": round(result.seconds, 3),
        "median_first_use_ttft_s": {"cold": before, "warmed": after},
        "first_use": {
            "cold": {k: asdict(v) for k, v in result.first_uses(result.cold).items()},
            "warmed": {k: asdict(v) for k, v in result.first_uses(result.warm).items()},
        },
        "records": learned.records if learned else 0,
        "plan_items": [i.key for i in learned.plan.items] if learned else [],
        "plan_notes": list(learned.plan.notes) if learned else [],
        "warm_report": result.report,
    }
