"""The forecaster selection on generated prefix-block traces it was never tuned on.

Each trace of :mod:`benchmarks.block_traces` (Mooncake class: bursty 1-minute windows,
block-hash chains, sessions, popularity drifting within the hour) is walked forward: the
selected model (:class:`models.selection.SelectedForecaster`, refitted every ``--refit-every``
windows from the history before it, the whole of it backtested) and every baseline predict each
later window. The property, per trace: the selected model's share of the history oracle is at
least the best baseline's minus one point at every budget, and its MAE at most 2% above the
lowest baseline MAE (as ``benchmarks/forecast_eval.py``'s done-when table checks the real
traces). Printed per trace: the selected model's lead over the best baseline per budget, its MAE
ratio, whether it holds, and the winner of each refit; then how many traces hold.

Usage::

    python benchmarks/selection_corpus.py [--seeds 9-20] [--minutes 40] [--rate 40]
        [--heads 12] [--refit-every 12] [--json F]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.block_traces import TraceShape, trace_counts
from models.baselines import baselines
from models.selection import SelectedForecaster
from pipeline.evaluation import CountMatrix, WalkForwardConfig, walk_forward

#: The property's slack, as benchmarks/forecast_eval.py's done-when table checks it.
SHARE_SLACK, MAE_SLACK = 0.01, 0.02
#: Mooncake's budgets of 100 and 1,000 blocks scaled to a trace with ~1/5 of its active blocks
#: a window (40 requests a minute against ~200).
BUDGETS = (20, 200)
#: The first history end the walk-forward predicts from.
FIRST_T = 15


class _Recorded(SelectedForecaster):
    """The selection, keeping the winner of every refit."""

    winners: list[str]

    def fit(self, matrix: CountMatrix, until: int | None = None) -> _Recorded:
        super().fit(matrix, until)
        self.winners.append(self.winner_name_)
        return self


def held_out(counts: pd.DataFrame, refit_every: int) -> tuple[pd.DataFrame, list[str]]:
    """Walk-forward of the baselines and the selected model: per budget, the selected model's
    share and MAE next to the best baseline's; and the winner of each refit."""
    matrix = CountMatrix.from_counts(counts)
    # No time budget: the whole history is backtested, so the result does not depend on load.
    selected = _Recorded(BUDGETS, time_budget_s=math.inf)
    selected.winners = []
    config = WalkForwardConfig(budget_items=BUDGETS, first_t=FIRST_T, refit_every=refit_every)
    table = walk_forward(matrix, {**baselines(), "selected": selected}, config).table
    rows = []
    for budget, part in table.groupby("budget", sort=False):
        base = part[part["model"].isin(list(baselines()))]
        chosen = part[part["model"] == "selected"].iloc[0]
        rows.append({"budget": budget, "share": chosen["share_of_history_oracle"],
                     "best_share": base["share_of_history_oracle"].max(),
                     "mae": chosen["mae"], "best_mae": base["mae"].min()})  # fmt: skip
    return pd.DataFrame(rows), selected.winners


def shortfalls(rows: pd.DataFrame) -> list[str]:
    """What of the property ``rows`` (from :func:`held_out`) break, in words (none: it holds)."""
    broken = [f"{row.budget}: share {100 * (row.share - row.best_share):+.2f} points"
              for row in rows.itertuples() if row.share < row.best_share - SHARE_SLACK]  # fmt: skip
    row = rows.iloc[0]
    if row["mae"] > row["best_mae"] * (1 + MAE_SLACK):
        broken.append(f"MAE {row['mae'] / row['best_mae']:.3f}x the lowest baseline's")
    return broken


def seeds(text: str) -> list[int]:
    """``9-20`` or ``0,3,5`` (or both, comma-separated) as a list of seeds; a range that is
    empty or half written is a ``ValueError`` (argparse: a usage error)."""
    out: list[int] = []
    for part in text.split(","):
        first, dash, last = part.partition("-")
        if dash and (not last or int(last) < int(first)):
            raise ValueError(f"{part!r} is not a range of seeds (e.g. 9-20)")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def run(shape: TraceShape, seed_list: list[int], refit_every: int) -> list[dict[str, Any]]:
    results = []
    for seed in seed_list:
        with tempfile.TemporaryDirectory() as folder:
            rows, winners = held_out(trace_counts(Path(folder), shape, seed), refit_every)
        lead = {row.budget: round(100 * (row.share - row.best_share), 2)
                for row in rows.itertuples()}  # fmt: skip
        result = {"seed": seed, "lead_points": lead,
                  "mae_ratio": round(float(rows["mae"].iloc[0] / rows["best_mae"].iloc[0]), 3),
                  "broken": shortfalls(rows), "winners": winners}  # fmt: skip
        print(f"trace {seed}: {'holds' if not result['broken'] else 'FAILS'}  lead {lead}  "
              f"MAE x{result['mae_ratio']}  winners {winners}  {'; '.join(result['broken'])}",
              flush=True)  # fmt: skip
        results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=seeds, default=seeds("9-20"))
    parser.add_argument("--minutes", type=int, default=40)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--refit-every", type=int, default=12)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    shape = TraceShape(minutes=args.minutes, rate=args.rate, heads=args.heads)
    results = run(shape, args.seeds, args.refit_every)
    held = sum(not result["broken"] for result in results)
    print(f"the property holds on {held} of {len(results)} traces")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
