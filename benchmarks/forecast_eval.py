"""Walk-forward evaluation tables of the hotness models on the real traces.

* Mooncake ``conversation_trace.jsonl``: prefix blocks, 5-minute and 1-minute windows,
  budgets of 100 and 1,000 blocks;
* ServeGen ``servegen/m-large``: one item per client, 10-minute windows over 14 days
  (budget 20 clients; here the MAE is what counts).

For each: per model, the captured share of next-window requests, its share of the history
oracle and of the oracle, and the MAE; plus the seconds of one full LightGBM fit on the whole
trace (the "trains in under a minute" check). ServeGen also gets the forecaster with the
``median`` objective, the L1-optimal forecast.

Each case also prints a *peeking ceiling*, which no forecaster can use: the ranking (Mooncake) or
forecast (ServeGen) made from the windows right around the target, ``t`` and ``t + 2 ..
t + 3``. It shows how much of the history oracle is the target window's own noise. ``--timing``
gives the Mooncake counts the optional timing columns (within-window recency, chain position).
Usage::

    python benchmarks/forecast_eval.py [--only mooncake-5min|mooncake-1min|servegen] [--timing]
        [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.cmd_evaluate import print_table, standard_models
from models.forecaster import HotnessForecaster
from pipeline.evaluation import CountMatrix, WalkForwardConfig, walk_forward
from pipeline.ingest.traces import read_mooncake, read_servegen
from pipeline.windows import item_window_counts

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
#: name -> (window, item budgets, steps between refits, first history end)
CASES = {
    "mooncake-5min": ("5min", (100, 1000), 1, 3),
    "mooncake-1min": ("1min", (100, 1000), 4, 14),
    "servegen": ("10min", (20,), 144, 288),
}


def counts_for(case: str, window: str, timing: bool = False) -> pd.DataFrame:
    """The counts table of one case."""
    if case.startswith("mooncake"):
        records = read_mooncake(TRACES / "conversation_trace.jsonl")
        return item_window_counts(records, window, timing=timing)
    return read_servegen(TRACES / "servegen" / "m-large")


def peeking_ceiling(
    matrix: CountMatrix, budgets: tuple[int, ...], first_t: int
) -> dict[str, float]:
    """Share of the history oracle (per budget) and MAE of the mean of windows ``t`` and
    ``t + 2 .. t + 3`` — the item's rate around the target, known only in hindsight."""
    captured = dict.fromkeys(budgets, 0.0)
    best = dict.fromkeys(budgets, 0.0)
    abs_error, n_scored = 0.0, 0
    for t in range(first_t, matrix.n_windows - 1):
        around = [t, *range(t + 2, min(matrix.n_windows, t + 4))]
        rate = matrix.requests[:, around].mean(axis=1)
        actual = matrix.requests[:, t + 1]
        seen = matrix.seen_by(t)
        for k in budgets:
            captured[k] += float(actual[seen[np.argsort(-rate[seen], kind="stable")[:k]]].sum())
            best[k] += float(np.sort(actual[seen])[::-1][:k].sum())
        scored = np.union1d(seen, np.flatnonzero(actual > 0))
        abs_error += float(np.abs(rate[scored] - actual[scored]).sum())
        n_scored += len(scored)
    shares = {f"{k} items of history oracle": captured[k] / max(best[k], 1) for k in budgets}
    return {**shares, "mae": abs_error / max(n_scored, 1)}


def fit_seconds(matrix: CountMatrix, model: HotnessForecaster) -> float:
    """Seconds of one fit on every window of ``matrix``."""
    started = time.perf_counter()
    model.fit(matrix)
    return time.perf_counter() - started


def run_case(case: str, console: Console, timing: bool = False) -> dict[str, object]:
    """Evaluate one case, print its table, and return it as JSON-ready values."""
    window, budgets, refit_every, first_t = CASES[case]
    counts = counts_for(case, window, timing)
    matrix = CountMatrix.from_counts(counts)
    models = standard_models()
    if case == "servegen":
        median = HotnessForecaster(objective="median")
        models["lightgbm_median"] = median
    config = WalkForwardConfig(budget_items=budgets, first_t=first_t, refit_every=refit_every)
    started = time.perf_counter()
    evaluation = walk_forward(matrix, models, config)
    seconds = time.perf_counter() - started
    title = (
        f"{case}: {matrix.n_items} items x {matrix.n_windows} windows of {window}, "
        f"{matrix.n_windows - 1 - first_t} steps, refit every {refit_every}"
    )
    print_table(console, title, evaluation.table)
    fit_s = fit_seconds(matrix, HotnessForecaster())
    console.print(f"walk-forward {seconds:.0f} s; one full LightGBM fit {fit_s:.1f} s")
    ceiling = peeking_ceiling(matrix, budgets, first_t)
    console.print("peeking ceiling: " + ", ".join(f"{k} {v:.3f}" for k, v in ceiling.items()))
    return {"case": case, "items": matrix.n_items, "windows": matrix.n_windows,
            "walk_forward_s": seconds, "fit_s": fit_s, "peeking_ceiling": ceiling,
            "table": evaluation.table.to_dict(orient="records")}  # fmt: skip


def main() -> None:
    """Run the cases and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    parser.add_argument("--json", type=Path, help="Also write the tables here.")
    parser.add_argument("--timing", action="store_true", help="Mooncake counts with timing.")
    args = parser.parse_args()
    console = Console(width=120)
    results = [run_case(case, console, args.timing) for case in (args.only or list(CASES))]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
