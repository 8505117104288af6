"""The forecaster selection on generated prefix-block traces it was never tuned on.

Each trace of :mod:`benchmarks.block_traces` (``--regime conversations``: the class of the
public Mooncake trace, block-hash chains of conversations with heavy-tailed turns, measured
there; ``--regime heads``: a dozen shared system-prompt heads whose popularity swings within
the hour, with bursts) is walked forward in ``--window`` windows (1 minute by default): the
selected model (:class:`models.selection.SelectedForecaster`, refitted every ``--refit-every``
windows from the history before it) and every baseline predict each later window. The
property, per trace, in the held-out windows' own noise
(:func:`pipeline.evaluation.held_out_margins`): at every budget the selected model's share of
the history oracle is at least the best baseline's minus one point and two standard errors of
their paired difference across the held-out windows, and its MAE at most 2% above the lowest
baseline MAE (as ``prewarm evaluate`` and ``benchmarks/forecast_eval.py`` check it). Printed per
trace: the margin over the best baseline per budget with its standard error, the MAE ratio,
whether it holds, and the winner of each refit; then how many traces hold, and a closing table
of every trace and budget: margin, its standard error, the bound it must clear, the MAE ratio
and whether the property holds (``--window 1min,5min,10min`` runs each seed in each window).

Usage::

    python benchmarks/selection_corpus.py [--regime conversations|heads] [--seeds 9-20]
        [--window 1min,5min,10min] [--budgets 20,100,1000] [--minutes M] [--rate R] [--heads 12]
        [--refit-every 12] [--trace conversation_trace.jsonl] [--json F]

The conversations default to an hour at the public trace's ~200 requests a minute and its
budgets of 100 and 1,000 blocks; the heads to 40 minutes at 40 requests a minute and budgets of
20 and 200 blocks. Longer windows lengthen the trace by as much (the same number of windows).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.block_traces import ConversationShape, Shape, TraceShape, trace_counts
from models.baselines import baselines
from models.selection import SelectedForecaster
from pipeline.evaluation import CountMatrix, WalkForwardConfig, held_out_margins, walk_forward
from pipeline.ingest.traces import read_mooncake
from pipeline.windows import item_window_counts

#: The budgets of each regime: the public trace's 100 and 1,000 blocks for conversations at
#: its rate; scaled to a fifth for the shared heads' ~40 requests a minute.
BUDGETS = {"conversations": (100, 1000), "heads": (20, 200)}
#: Requests a minute and minutes of each regime by default.
RATES = {"conversations": 200.0, "heads": 40.0}
MINUTES = {"conversations": 60, "heads": 40}
#: The first history end the walk-forward predicts from.
FIRST_T = 15
#: Items x windows of one trace's matrix at most (the loop's limit is a third of it).
BENCHMARK_MAX_CELLS = 180_000_000


class _Recorded(SelectedForecaster):
    """The selection, keeping the winner of every refit."""

    winners: list[str]

    def fit(self, matrix: CountMatrix, until: int | None = None) -> _Recorded:
        super().fit(matrix, until)
        self.winners.append(self.winner_name_)
        return self


def held_out(
    counts: pd.DataFrame, refit_every: int, budgets: tuple[int, ...], first_t: int = FIRST_T
) -> tuple[pd.DataFrame, list[str]]:
    """Walk-forward of the baselines and the selected model at ``budgets`` (items) from
    history end ``first_t``: the selected model's margins over the best baseline per budget
    (:func:`pipeline.evaluation.held_out_margins`), and the winner of each refit."""
    # The walk-forward needs the whole history in one matrix: a conversations trace in 10-minute
    # windows (600 minutes, ~1.2 million blocks x 60 windows) is over the loop's limit, which
    # reads the latest windows that fit instead.
    matrix = CountMatrix.from_counts(counts, max_cells=BENCHMARK_MAX_CELLS)
    selected = _Recorded(budgets)
    selected.winners = []
    config = WalkForwardConfig(budget_items=budgets, first_t=first_t, refit_every=refit_every)
    evaluation = walk_forward(matrix, {**baselines(), "selected": selected}, config)
    return held_out_margins(evaluation.steps, "selected", list(baselines())), selected.winners


def shortfalls(margins: pd.DataFrame) -> list[str]:
    """What of the property ``margins`` (from :func:`held_out`) break, in words (none: it
    holds)."""
    broken = [f"{row.budget}: {row.margin:+.2f} points (bound {row.bound:+.2f})"
              for row in margins.itertuples() if not row.share_ok]  # fmt: skip
    row = margins.iloc[0]
    if not row["mae_ok"]:
        broken.append(f"MAE {row['mae_ratio']:.3f}x the lowest baseline's")
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


def shape_of(
    regime: str, minutes: int | None, rate: float | None, heads: int, window: str = "1min"
) -> Shape:
    """The generator's shape of a regime (``minutes``, ``rate``: that regime's default when
    ``None``, its minutes as many ``window`` windows as it has minutes)."""
    rate = RATES[regime] if rate is None else rate
    scale = int(pd.Timedelta(window) / pd.Timedelta(minutes=1))
    minutes = MINUTES[regime] * scale if minutes is None else minutes
    if regime == "conversations":
        return ConversationShape(minutes=minutes, rate=rate)
    return TraceShape(minutes=minutes, rate=rate, heads=heads)


def report(
    name: str, counts: pd.DataFrame, refit_every: int, budgets: tuple[int, ...], window: str
) -> dict[str, Any]:
    """One trace's margins, whether the property holds, and the winners; printed."""
    margins, winners = held_out(counts, refit_every, budgets)
    lead = {row.budget: round(row.margin, 2) for row in margins.itertuples()}
    noise = {row.budget: round(row.se, 2) for row in margins.itertuples()}
    result = {"trace": name, "window": window, "lead_points": lead, "lead_se_points": noise,
              "mae_ratio": round(float(margins["mae_ratio"].iloc[0]), 3),
              "broken": shortfalls(margins), "winners": winners,
              "margins": margins.to_dict(orient="records")}  # fmt: skip
    print(f"trace {name} ({window}): {'holds' if not result['broken'] else 'FAILS'}  "
          f"margin {lead}  (SE {noise})  MAE x{result['mae_ratio']}  winners {winners}  "
          f"{'; '.join(result['broken'])}", flush=True)  # fmt: skip
    return result


def run(
    shape: Shape,
    seed_list: list[int],
    refit_every: int,
    budgets: tuple[int, ...],
    window: str = "1min",
) -> list[dict[str, Any]]:
    """Each seed's generated trace in ``window`` windows (:func:`report`)."""
    results = []
    for seed in seed_list:
        with tempfile.TemporaryDirectory() as folder:
            counts = trace_counts(Path(folder), shape, seed, window)
        results.append(report(str(seed), counts, refit_every, budgets, window))
    return results


def closing_table(results: list[dict[str, Any]]) -> list[str]:
    """One line per trace, window and budget: margin and its standard error (points of the
    history oracle), the bound, the MAE ratio, and whether the property holds there."""
    lines = ["trace  window  budget       margin     SE   bound  MAE ratio  holds"]
    for result in results:
        for row in result["margins"]:
            lines.append(f"{result['trace']:>5}  {result['window']:>6}  {row['budget']:>10}  "
                         f"{row['margin']:+7.2f}  {row['se']:5.2f}  {row['bound']:+6.2f}  "
                         f"{row['mae_ratio']:9.3f}  {'yes' if row['holds'] else 'NO'}")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--regime", choices=sorted(BUDGETS), default="conversations")
    parser.add_argument("--seeds", type=seeds, default=seeds("9-20"))
    parser.add_argument("--window", default="1min")
    parser.add_argument("--budgets", type=lambda text: tuple(int(b) for b in text.split(",")))
    parser.add_argument("--minutes", type=int)
    parser.add_argument("--rate", type=float)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--refit-every", type=int, default=12)
    parser.add_argument("--trace", type=Path, help="a Mooncake trace instead of generated ones")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    budgets = args.budgets or BUDGETS[args.regime]
    results = []
    for window in args.window.split(","):
        if args.trace is not None:
            counts = item_window_counts(read_mooncake(args.trace), window)
            results.append(report(args.trace.name, counts, args.refit_every, budgets, window))
        else:
            shape = shape_of(args.regime, args.minutes, args.rate, args.heads, window)
            results.extend(run(shape, args.seeds, args.refit_every, budgets, window))
        if args.json:  # what ran so far, should a long run be stopped
            args.json.write_text(json.dumps(results, indent=2, default=str))
    held = sum(not result["broken"] for result in results)
    print(f"the property holds on {held} of {len(results)} traces")
    print("\n".join(closing_table(results)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
