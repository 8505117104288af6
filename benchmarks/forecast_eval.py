"""Walk-forward evaluation tables of the hotness models on the real traces.

* Mooncake ``conversation_trace.jsonl``: prefix blocks, 5-minute and 1-minute windows,
  budgets of 100 and 1,000 blocks;
* ServeGen ``servegen/m-large``: one item per client, 10-minute windows over 14 days
  (budget 20 clients; here the MAE is what counts).

For each: per model, the captured share of next-window requests, its share of the history
oracle and of the oracle, and the MAE; plus the seconds of one full LightGBM fit on the whole
trace (the "trains in under a minute" check). ServeGen also gets the forecaster with the
``median`` objective, the L1-optimal forecast. Usage::

    python benchmarks/forecast_eval.py [--only mooncake-5min|mooncake-1min|servegen] [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

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


def counts_for(case: str, window: str) -> pd.DataFrame:
    """The counts table of one case."""
    if case.startswith("mooncake"):
        return item_window_counts(read_mooncake(TRACES / "conversation_trace.jsonl"), window)
    return read_servegen(TRACES / "servegen" / "m-large")


def fit_seconds(matrix: CountMatrix, model: HotnessForecaster) -> float:
    """Seconds of one fit on every window of ``matrix``."""
    started = time.perf_counter()
    model.fit(matrix)
    return time.perf_counter() - started


def run_case(case: str, console: Console) -> dict[str, object]:
    """Evaluate one case, print its table, and return it as JSON-ready values."""
    window, budgets, refit_every, first_t = CASES[case]
    counts = counts_for(case, window)
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
    return {"case": case, "items": matrix.n_items, "windows": matrix.n_windows,
            "walk_forward_s": seconds, "fit_s": fit_s,
            "table": evaluation.table.to_dict(orient="records")}  # fmt: skip


def main() -> None:
    """Run the cases and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    parser.add_argument("--json", type=Path, help="Also write the tables here.")
    args = parser.parse_args()
    console = Console(width=120)
    results = [run_case(case, console) for case in (args.only or list(CASES))]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
