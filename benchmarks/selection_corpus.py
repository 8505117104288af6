"""The forecaster selection on generated prefix-block traces it was never tuned on.

Each trace of :mod:`benchmarks.block_traces` (``--regime conversations``: the class of the
public Mooncake trace, block-hash chains of conversations with heavy-tailed turns, measured
there; ``--regime heads``: a dozen shared system-prompt heads whose popularity swings within
the hour, with bursts) is walked forward in 1-minute windows: the
selected model (:class:`models.selection.SelectedForecaster`, refitted every ``--refit-every``
windows from the history before it, the whole of it backtested) and every baseline predict each
later window. The property, per trace: the selected model's share of the history oracle is at
least the best baseline's minus one point at every budget, and its MAE at most 2% above the
lowest baseline MAE (as ``benchmarks/forecast_eval.py``'s done-when table checks the real
traces). Printed per trace: the selected model's lead over the best baseline per budget, its MAE
ratio, whether it holds, and the winner of each refit; then how many traces hold.

Usage::

    python benchmarks/selection_corpus.py [--regime conversations|heads] [--seeds 9-20]
        [--minutes M] [--rate R] [--heads 12] [--refit-every 12] [--json F]

The conversations default to an hour at the public trace's ~200 requests a minute and its
budgets of 100 and 1,000 blocks; the heads to 40 minutes at 40 requests a minute and budgets of
20 and 200 blocks.
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

from benchmarks.block_traces import ConversationShape, Shape, TraceShape, trace_counts
from models.backtest import standard_error
from models.baselines import baselines
from models.selection import SelectedForecaster
from pipeline.evaluation import CountMatrix, WalkForwardConfig, walk_forward

#: The property's slack, as benchmarks/forecast_eval.py's done-when table checks it.
SHARE_SLACK, MAE_SLACK = 0.01, 0.02
#: The budgets of each regime: the public trace's 100 and 1,000 blocks for conversations at
#: its rate; scaled to a fifth for the shared heads' ~40 requests a minute.
BUDGETS = {"conversations": (100, 1000), "heads": (20, 200)}
#: Requests a minute and minutes of each regime by default.
RATES = {"conversations": 200.0, "heads": 40.0}
MINUTES = {"conversations": 60, "heads": 40}
#: The first history end the walk-forward predicts from.
FIRST_T = 15


class _Recorded(SelectedForecaster):
    """The selection, keeping the winner of every refit."""

    winners: list[str]

    def fit(self, matrix: CountMatrix, until: int | None = None) -> _Recorded:
        super().fit(matrix, until)
        self.winners.append(self.winner_name_)
        return self


def held_out(
    counts: pd.DataFrame, refit_every: int, budgets: tuple[int, ...]
) -> tuple[pd.DataFrame, list[str]]:
    """Walk-forward of the baselines and the selected model at ``budgets`` (items): per
    budget, the selected model's share and MAE next to the best baseline's, and the noise of
    the share gap (``gap_se``: the standard error of the window-by-window difference in captured
    requests between the two, over the history oracle); and the winner of each refit."""
    matrix = CountMatrix.from_counts(counts)
    # No time budget: the whole history is backtested, so the result does not depend on load.
    selected = _Recorded(budgets, time_budget_s=math.inf)
    selected.winners = []
    config = WalkForwardConfig(budget_items=budgets, first_t=FIRST_T, refit_every=refit_every)
    evaluation = walk_forward(matrix, {**baselines(), "selected": selected}, config)
    rows = []
    for budget, part in evaluation.table.groupby("budget", sort=False):
        base = part[part["model"].isin(list(baselines()))]
        best = base.loc[base["share_of_history_oracle"].idxmax()]
        chosen = part[part["model"] == "selected"].iloc[0]
        steps = evaluation.steps[evaluation.steps["budget"] == budget]
        rows.append({"budget": budget, "share": chosen["share_of_history_oracle"],
                     "best_share": best["share_of_history_oracle"],
                     "gap_se": gap_noise(steps, "selected", str(best["model"])),
                     "mae": chosen["mae"], "best_mae": base["mae"].min()})  # fmt: skip
    return pd.DataFrame(rows), selected.winners


def gap_noise(steps: pd.DataFrame, model: str, baseline: str) -> float:
    """Standard error of ``model``'s share minus ``baseline``'s over one budget's steps, as the
    backtest measures its own (:func:`models.backtest.standard_error`: infinite with one step):
    the spread of their window-by-window difference in captured requests, over the oracle's."""
    captured = steps.pivot_table(index="t", columns="model", values="captured")
    difference = (captured[model] - captured[baseline]).to_numpy()
    oracle = float(steps.groupby("t")["history_oracle"].first().sum())
    return float(standard_error(difference[None, :])[0]) / max(oracle, 1e-12)


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


def shape_of(regime: str, minutes: int | None, rate: float | None, heads: int) -> Shape:
    """The generator's shape of a regime (``minutes``, ``rate``: that regime's default when
    ``None``)."""
    rate = RATES[regime] if rate is None else rate
    minutes = MINUTES[regime] if minutes is None else minutes
    if regime == "conversations":
        return ConversationShape(minutes=minutes, rate=rate)
    return TraceShape(minutes=minutes, rate=rate, heads=heads)


def run(
    shape: Shape, seed_list: list[int], refit_every: int, budgets: tuple[int, ...]
) -> list[dict[str, Any]]:
    results = []
    for seed in seed_list:
        with tempfile.TemporaryDirectory() as folder:
            counts = trace_counts(Path(folder), shape, seed)
            rows, winners = held_out(counts, refit_every, budgets)
        lead = {row.budget: round(100 * (row.share - row.best_share), 2)
                for row in rows.itertuples()}  # fmt: skip
        noise = {row.budget: round(100 * row.gap_se, 2) for row in rows.itertuples()}
        result = {"seed": seed, "lead_points": lead, "lead_se_points": noise,
                  "mae_ratio": round(float(rows["mae"].iloc[0] / rows["best_mae"].iloc[0]), 3),
                  "broken": shortfalls(rows), "winners": winners}  # fmt: skip
        print(f"trace {seed}: {'holds' if not result['broken'] else 'FAILS'}  lead {lead}  "
              f"(SE {noise})  "
              f"MAE x{result['mae_ratio']}  winners {winners}  {'; '.join(result['broken'])}",
              flush=True)  # fmt: skip
        results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--regime", choices=sorted(BUDGETS), default="conversations")
    parser.add_argument("--seeds", type=seeds, default=seeds("9-20"))
    parser.add_argument("--minutes", type=int)
    parser.add_argument("--rate", type=float)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--refit-every", type=int, default=12)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    shape = shape_of(args.regime, args.minutes, args.rate, args.heads)
    results = run(shape, args.seeds, args.refit_every, BUDGETS[args.regime])
    held = sum(not result["broken"] for result in results)
    print(f"the property holds on {held} of {len(results)} traces")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
