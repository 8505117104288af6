"""``prewarm evaluate``: walk-forward evaluation of the hotness models on a trace or log.

``prewarm evaluate PATH --window 5min --budget 100 [--budget 1000] [--json] [--plot FILE]``
reads PATH (any log or trace ``prewarm ingest`` reads, a ServeGen folder, a counts table
``counts.parquet``/``windows.parquet`` or an ingest output folder holding one), counts item
requests per window, and runs every baseline, the LightGBM forecaster and the model the loop
would use — ``selected``, the backtest winner chosen on every refit from the history before it
(:mod:`models.selection`) — walk-forward (see :mod:`pipeline.evaluation`). It prints, per budget
and model: the captured share of next-window requests, its share of the history oracle and of
the oracle, and the MAE of predicted counts; then, per budget, the selected model's margin over
the best baseline on these held-out windows with its standard error, and whether the held-out
property holds (:func:`pipeline.evaluation.held_out_margins`); then which candidates the
selection chose.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import pandas as pd
import typer
from rich.console import Console
from rich.table import Table

from jobs import option_checks
from jobs.locations import check_inputs, local_inputs
from models.baselines import HotnessModel, baselines
from models.selection import SelectedForecaster
from pipeline.errors import BadInputError
from pipeline.evaluation import (
    CountMatrix,
    Evaluation,
    WalkForwardConfig,
    coarsen_counts,
    held_out_margins,
    walk_forward,
)
from pipeline.ingest import IngestOptions, ingest_paths
from pipeline.ingest.detect import detect_format
from pipeline.ingest.run import expand_paths
from pipeline.ingest.traces import read_servegen
from pipeline.tables import read_parquet_file
from pipeline.windows import ITEM_KINDS, item_window_counts

if TYPE_CHECKING:
    from models.forecaster import HotnessForecaster

#: Refits per run when --refit-every is not given: enough to follow drift, bounded in time.
DEFAULT_REFITS = 12


def load_counts(path: Path, window: str) -> pd.DataFrame:
    """Item × window counts of ``path`` at ``window`` (a pandas offset such as ``5min``)."""
    step = pd.Timedelta(window)
    tables = (
        [path / name for name in ("counts.parquet", "windows.parquet")] if path.is_dir() else []
    )
    parquet = next((table for table in tables if table.is_file()), path)
    if parquet.suffix == ".parquet" and parquet.is_file():
        return coarsen_counts(read_parquet_file(parquet, "counts"), step)
    files = expand_paths([path])
    if files and all(detect_format(f) == "servegen" for f in files):
        return coarsen_counts(read_servegen(path), step)
    result = ingest_paths([path], IngestOptions(window=window, workers=1))
    if not result.records.empty:
        return item_window_counts(result.records, window)
    if result.windows is None:
        raise BadInputError("nothing prewarm can count was found", where=str(path))
    return coarsen_counts(result.windows, step)


def default_kind(counts: pd.DataFrame) -> str:
    """``prefix`` when the counts have prefix items, else the kind with the most items."""
    kinds = counts.groupby("item_kind", observed=True)["item_key"].nunique()
    if kinds.empty:
        raise BadInputError("no items", where="counts")
    return "prefix" if "prefix" in kinds.index else str(kinds.idxmax())


def standard_models(
    forecaster: HotnessForecaster | None = None, budgets: tuple[int, ...] = (100,)
) -> dict[str, HotnessModel | WinnerLog]:
    """Every baseline, the LightGBM forecaster, and the backtest-selected model (what the loop
    uses, selected at ``budgets`` on every refit from the history before it), by name."""
    from models.forecaster import HotnessForecaster  # lightgbm: ~3 s, only for this command

    model = forecaster or HotnessForecaster()
    return {**baselines(), model.name: model, "selected": WinnerLog(SelectedForecaster(budgets))}


class WinnerLog:
    """A :class:`SelectedForecaster` that remembers the winner of each of its refits."""

    def __init__(self, selected: SelectedForecaster) -> None:
        self.selected = selected
        self.winners: list[tuple[pd.Timestamp, str]] = []

    def fit(self, matrix: CountMatrix, until: int) -> WinnerLog:
        self.selected.fit(matrix, until)
        self.winners.append((self.selected.trained_until_, self.selected.winner_name_))
        return self

    def predict_at(
        self, matrix: CountMatrix, t: int, items: np.ndarray, horizon: int = 1
    ) -> np.ndarray:
        return self.selected.predict_at(matrix, t, items, horizon)

    def last_report(self) -> dict[str, Any] | None:
        """The last refit's selection report (backtest table and margin), if any."""
        return self.selected.report() if self.winners else None

    def summary(self) -> str:
        """``winner xN, ...`` over the refits, and the last refit's note."""
        counts = Counter(name for _, name in self.winners)
        chosen = ", ".join(f"{name} x{n}" for name, n in counts.most_common())
        return f"selected by backtest at each of {len(self.winners)} refit(s): {chosen}" + (
            f" (last: {self.selected.note_})" if self.winners else ""
        )


def evaluate_counts(
    counts: pd.DataFrame,
    budgets: tuple[int, ...],
    budget_tokens: tuple[int, ...] = (),
    kind: str | None = None,
    refit_every: int | None = None,
    first_t: int | None = None,
) -> tuple[CountMatrix, Evaluation]:
    """Walk-forward evaluation of :func:`standard_models` on ``counts`` (one item kind)."""
    matrix = CountMatrix.from_counts(counts, kind=kind or default_kind(counts))
    start = first_t if first_t is not None else max(2, matrix.n_windows // 4)
    steps = max(1, matrix.n_windows - 1 - start)
    config = WalkForwardConfig(
        budget_items=budgets,
        budget_tokens=budget_tokens,
        first_t=start,
        refit_every=refit_every or max(1, -(-steps // DEFAULT_REFITS)),
    )
    models = standard_models(budgets=budgets or (100,))
    evaluation = walk_forward(matrix, models, config)
    selected = models["selected"]
    notes = (selected.summary(),) if isinstance(selected, WinnerLog) else ()
    report = selected.last_report() if isinstance(selected, WinnerLog) else None
    return matrix, replace(evaluation, notes=notes, selection=report)


def selected_margins(evaluation: Evaluation) -> pd.DataFrame:
    """The selected model against the best baseline on the evaluation's held-out windows, per
    budget (:func:`pipeline.evaluation.held_out_margins`)."""
    return held_out_margins(evaluation.steps, "selected", list(baselines()))


def print_margins(console: Console, margins: pd.DataFrame) -> None:
    """Per budget: the selected model's margin over the best baseline (points of the history
    oracle), its standard error, the bound it must clear, the MAE ratio, and which holds."""
    out = Table(title="held out: selected vs the best baseline (>= -(1 pt + 2 SE), MAE <= x1.02)")
    for column in ("budget", "baseline", "margin", "SE", "bound", "share", "MAE ratio", "MAE",
                   "holds"):  # fmt: skip
        out.add_column(column, justify="left" if column in ("budget", "baseline") else "right")
    for row in margins.itertuples():
        out.add_row(str(row.budget), str(row.baseline), f"{row.margin:+.2f} pts",
                    f"{row.se:.2f}", f"{row.bound:+.2f}", _verdict(bool(row.share_ok)),
                    f"x{row.mae_ratio:.3f} vs {row.mae_baseline}", _verdict(bool(row.mae_ok)),
                    _verdict(bool(row.holds)))  # fmt: skip
    console.print(out)


def _verdict(ok: bool) -> str:
    return "holds" if ok else "FAILS"


def print_backtest(console: Console, report: dict[str, Any]) -> None:
    """The backtest table the last selection chose from, and the winner's margin."""
    rows = report["table"]
    budgets = [key for key in rows[0] if key.startswith("share ")] if rows else []
    span = f"{report['backtest_from']} .. {report['backtest_until']}"
    origins = report["margin"]["origins"]
    out = Table(title=f"backtest {span}: {origins} origins, winner {report['winner']}")
    for column in ("model", *budgets, "MAE", "behind (tol.)"):
        out.add_column(column, justify="left" if column == "model" else "right")
    for row in rows:
        shortfall = row["shortfall"]
        out.add_row(str(row["model"]), *(f"{row[b]:.1%}" for b in budgets), f"{row['mae']:,.4g}",
                    "-" if shortfall is None else f"{shortfall:+.2f}")  # fmt: skip
    console.print(out)
    console.print(margin_line(report))


def margin_line(report: dict[str, Any]) -> str:
    """``margin of WINNER over the best baseline: ...`` in points of the history oracle (one
    standard error in brackets) per budget, and the MAE ratio."""
    margin = report["margin"]
    parts = [
        f"{budget} {m['points']:+.2f} pts vs {m['baseline']} (SE {_noise(m['noise_points'])})"
        for budget, m in margin["share"].items()
    ]
    ratio = f"MAE x{margin['mae_ratio']:.3f} vs {margin['mae_baseline']}"
    noise = f" (SE {_noise(margin['mae_ratio_noise'], 3)})"
    return f"margin of {report['winner']} over the best baseline: " + "; ".join(
        [*parts, ratio + noise]
    )


def _noise(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def print_table(console: Console, title: str, table: pd.DataFrame) -> None:
    """The evaluation table as a rich table."""
    out = Table(title=title)
    columns = ("budget", "model", "captured", "of history oracle", "of oracle", "MAE")
    for column in columns:
        out.add_column(column, justify="left" if column in ("budget", "model") else "right")
    for row in table.itertuples():
        out.add_row(
            str(row.budget), str(row.model), f"{row.captured_share:.2%}",
            f"{row.share_of_history_oracle:.1%}", f"{row.share_of_oracle:.1%}", f"{row.mae:,.3f}",
        )  # fmt: skip
    console.print(out)


def plot_steps(evaluation: Evaluation, path: Path) -> None:
    """Captured share per step and model, one panel per budget, as an image file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = evaluation.steps.assign(share=lambda f: f["captured"] / f["total"].clip(lower=1))
    budgets = list(dict.fromkeys(steps["budget"]))
    fig, axes = plt.subplots(len(budgets), 1, figsize=(9, 3 * len(budgets)), squeeze=False)
    for axis, budget in zip(axes[:, 0], budgets, strict=True):
        part = steps[steps["budget"] == budget]
        for model, rows in part.groupby("model", sort=False):
            axis.plot(rows["window_start"], rows["share"], label=str(model))
        oracle = part.drop_duplicates("t")
        axis.plot(oracle["window_start"], oracle["history_oracle"] / oracle["total"], "k--",
                  label="history oracle")  # fmt: skip
        axis.set_title(f"budget {budget}")
        axis.set_ylabel("captured share")
    axes[0, 0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def evaluate(
    location: Annotated[
        str,
        typer.Argument(
            help="Trace, log, ServeGen folder or counts table (a path or an s3:// URL).",
            metavar="PATH",
        ),
    ],
    window: Annotated[
        str, typer.Option(help="Window length (pandas offset).", callback=option_checks.window)
    ] = "5min",
    budget: Annotated[list[int], typer.Option(min=1, help="Items to warm (repeatable).")] = [100],  # noqa: B006
    budget_tokens: Annotated[
        list[int], typer.Option(min=1, help="Token budgets (repeatable).")
    ] = [],  # noqa: B006
    kind: Annotated[
        str | None,
        typer.Option(
            help=f"Item kind: {', '.join(ITEM_KINDS)} (default: prefix, else the most common).",
            callback=option_checks.one_of(ITEM_KINDS),
        ),
    ] = None,
    refit_every: Annotated[int | None, typer.Option(min=1, help="Steps between refits.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the table as JSON.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Write a plot of every step here.")] = None,
) -> None:
    """Walk-forward: what each model's warmed set would have captured, next to the oracles."""
    check_inputs([location], "'PATH'")
    with local_inputs([location]) as (path,):
        counts = load_counts(path, window)
    matrix, evaluation = evaluate_counts(
        counts, tuple(budget), tuple(budget_tokens), kind, refit_every
    )
    if plot is not None:
        plot_steps(evaluation, plot)
    if as_json:
        payload = {"path": location, "window": window, "items": matrix.n_items,
                   "windows": matrix.n_windows, "notes": list(evaluation.notes),
                   "selection": evaluation.selection,
                   "held_out": selected_margins(evaluation).to_dict(orient="records"),
                   "table": evaluation.table.to_dict(orient="records")}  # fmt: skip
        typer.echo(json.dumps(payload, default=str))
        return
    name = location.rstrip("/").rsplit("/", 1)[-1]
    title = f"{name}: {matrix.n_items} items x {matrix.n_windows} windows of {window}"
    console = Console()
    print_table(console, title, evaluation.table)
    print_margins(console, selected_margins(evaluation))
    for note in evaluation.notes:
        console.print(note)
    if evaluation.selection is not None:
        print_backtest(console, evaluation.selection)


def register(app: typer.Typer) -> None:
    """Add ``prewarm evaluate``."""
    app.command("evaluate")(evaluate)
