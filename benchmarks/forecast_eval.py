"""Walk-forward evaluation tables of the hotness models on the real traces.

* Mooncake ``conversation_trace.jsonl``: prefix blocks, 5-minute and 1-minute windows,
  budgets of 100 and 1,000 blocks;
* ServeGen ``servegen/m-large``: one item per client, 10-minute windows over 14 days
  (budget 20 clients; here the MAE is what counts).

For each: per model, the captured share of next-window requests, its share of the history
oracle and of the oracle, and the MAE; plus the seconds of one full LightGBM fit on the whole
trace and of one selection (training plus selection), with the selection's CPU seconds per item
and window. ServeGen also
gets the forecaster with the ``median`` objective, the L1-optimal forecast.

``selected`` is what the loop uses: on every refit, :class:`models.selection.SelectedForecaster`
backtests its candidates rolling-origin on the windows *before* the refit (the latest 48 origins at
most: a size in work, not seconds, so the same choice at any load) and keeps the winner as the
backtest fitted it at its last origin, so it is judged on later windows it never chose on; the last
refit's backtest table and the winner's margin are printed after each case. The closing **done-when
table** puts it next to the best baseline of each case and budget, in the held-out windows' own
noise (:func:`pipeline.evaluation.held_out_margins`): its share of the history oracle must be at
least the best baseline's minus one point and two standard errors of their paired difference across
the windows, its MAE at most the lowest baseline MAE plus 2%. (The Azure traces carry no items — no
prefixes, prompts or tenants, only arrival times and token counts — so there is nothing per item to
forecast in them, and no case here.)

Each case also prints a *peeking ceiling*, which no forecaster can use: the ranking (Mooncake) or
forecast (ServeGen) made from the windows right around the target, ``t`` and ``t + 2 ..
t + 3``. It shows how much of the history oracle is the target window's own noise. ``--timing``
gives the Mooncake counts the optional timing columns (within-window recency, chain position).
Usage::

    python benchmarks/forecast_eval.py [--only mooncake-5min|mooncake-1min|servegen] [--timing]
        [--json F] [--smoke]

``--smoke`` runs the ``mooncake-5min`` case on the trace's first ``SMOKE_MINUTES`` minutes only
(a few windows): seconds, as the test suite does; its numbers mean nothing.
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
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobs.cmd_evaluate import WinnerLog, print_backtest, print_table, standard_models
from models.baselines import HotnessModel, baselines
from models.forecaster import HotnessForecaster
from models.selection import SelectedForecaster
from pipeline.evaluation import CountMatrix, WalkForwardConfig, held_out_margins, walk_forward
from pipeline.ingest.traces import read_mooncake, read_servegen
from pipeline.windows import item_window_counts

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
#: name -> (window, item budgets, steps between refits, first history end)
CASES = {
    "mooncake-5min": ("5min", (100, 1000), 1, 3),
    "mooncake-1min": ("1min", (100, 1000), 4, 14),
    "servegen": ("10min", (20,), 144, 288),
}


#: minutes of the Mooncake trace a ``--smoke`` run reads (six 5-minute windows)
SMOKE_MINUTES = 30


def counts_for(
    case: str, window: str, timing: bool = False, minutes: float | None = None
) -> pd.DataFrame:
    """The counts table of one case (of the Mooncake trace's first ``minutes``, if given)."""
    if case.startswith("mooncake"):
        records = read_mooncake(TRACES / "conversation_trace.jsonl")
        if minutes is not None:
            records = records[records["ts"] < records["ts"].min() + pd.Timedelta(minutes=minutes)]
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


def fit_seconds(matrix: CountMatrix, model: HotnessModel) -> float:
    """Seconds of one fit on every window of ``matrix``."""
    started = time.perf_counter()
    model.fit(matrix)
    return time.perf_counter() - started


def run_case(
    case: str, console: Console, timing: bool = False, minutes: float | None = None
) -> dict[str, object]:
    """Evaluate one case, print its table, and return it as JSON-ready values."""
    window, budgets, refit_every, first_t = CASES[case]
    counts = counts_for(case, window, timing, minutes)
    matrix = CountMatrix.from_counts(counts)
    models = standard_models(budgets=budgets)
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
    selected = models["selected"]
    assert isinstance(selected, WinnerLog)
    console.print(selected.summary())
    report = selected.last_report()
    if report is not None:
        print_backtest(console, report)
    fit_s = fit_seconds(matrix, HotnessForecaster())
    selection = SelectedForecaster(budgets)
    select_s = fit_seconds(matrix, selection)
    select_cpu = selection.cpu_seconds_
    per_cell = 1e6 * select_cpu / (matrix.n_items * matrix.n_windows)
    console.print(
        f"walk-forward {seconds:.0f} s; one full LightGBM fit {fit_s:.1f} s; "
        f"one selection on the whole trace (training + selection) {select_s:.1f} s, "
        f"{select_cpu:.1f} CPU s ({per_cell:.2f} CPU us per item and window)"
    )
    ceiling = peeking_ceiling(matrix, budgets, first_t)
    console.print("peeking ceiling: " + ", ".join(f"{k} {v:.3f}" for k, v in ceiling.items()))
    return {"case": case, "items": matrix.n_items, "windows": matrix.n_windows,
            "walk_forward_s": seconds, "fit_s": fit_s, "selection_s": select_s,
            "selection_cpu_s": select_cpu,
            "winners": [name for _, name in selected.winners], "peeking_ceiling": ceiling,
            "last_selection": report,
            "held_out": held_out_margins(evaluation.steps, "selected", list(baselines()))
            .to_dict(orient="records"),
            "table": evaluation.table.to_dict(orient="records")}  # fmt: skip


def done_when_rows(
    case: str, table: pd.DataFrame, held_out: pd.DataFrame
) -> list[dict[str, object]]:
    """Per budget: the selected model against the best baseline on share (its margin, that
    margin's standard error and the bound it must clear) and on MAE."""
    names = set(baselines())
    rows = []
    for budget, part in table.groupby("budget", sort=False):
        base = part[part["model"].isin(names)]
        chosen = part[part["model"] == "selected"].iloc[0]
        margin = held_out[held_out["budget"] == budget].iloc[0]
        rows.append({"case": case, "budget": budget,
                     "selected_share": chosen["share_of_history_oracle"],
                     "best_baseline_share": base["share_of_history_oracle"].max(),
                     "share_baseline": margin["baseline"], "margin": margin["margin"],
                     "se": margin["se"], "bound": margin["bound"],
                     "selected_mae": chosen["mae"], "best_baseline_mae": base["mae"].min(),
                     "mae_baseline": margin["mae_baseline"],
                     "share_ok": bool(margin["share_ok"]),
                     "mae_ok": bool(margin["mae_ok"])})  # fmt: skip
    return rows


def print_done_when(console: Console, rows: list[dict[str, object]]) -> None:
    """The done-when table: one row per case and budget."""
    out = Table(title="done when: selected vs the best baseline (share of history oracle, MAE)")
    for column in ("case", "budget", "selected", "best baseline", "margin", "SE", "bound", "ok",
                   "selected MAE", "best baseline MAE", "MAE ratio", "ok "):  # fmt: skip
        out.add_column(column, justify="left" if column in ("case", "budget") else "right")
    for r in rows:
        s, b, m, bm, margin, se, bound = (
            float(r[key])  # type: ignore[arg-type]  # the row's numbers, as done_when_rows made them
            for key in ("selected_share", "best_baseline_share", "selected_mae",
                        "best_baseline_mae", "margin", "se", "bound")
        )  # fmt: skip
        out.add_row(str(r["case"]), str(r["budget"]), f"{s:.1%}", f"{b:.1%} {r['share_baseline']}",
                    f"{margin:+.2f}", f"{se:.2f}", f"{bound:+.2f}",
                    "yes" if r["share_ok"] else "NO", f"{m:,.4g}",
                    f"{bm:,.4g} {r['mae_baseline']}", f"{m / bm:.3f}",
                    "yes" if r["mae_ok"] else "NO")  # fmt: skip
    console.print(out)


def main(argv: list[str] | None = None) -> None:
    """Run the cases and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    parser.add_argument("--json", type=Path, help="Also write the tables here.")
    parser.add_argument("--timing", action="store_true", help="Mooncake counts with timing.")
    parser.add_argument("--smoke", action="store_true", help="a few windows of one case")
    args = parser.parse_args(argv)
    minutes = SMOKE_MINUTES if args.smoke else None
    cases = ["mooncake-5min"] if args.smoke else (args.only or list(CASES))
    console = Console(width=140)
    results = [run_case(case, console, args.timing, minutes) for case in cases]
    rows = [
        row
        for result in results
        for row in done_when_rows(
            str(result["case"]), pd.DataFrame(result["table"]), pd.DataFrame(result["held_out"])
        )
    ]
    print_done_when(console, rows)
    for result in results:
        result["done_when"] = [r for r in rows if r["case"] == result["case"]]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
