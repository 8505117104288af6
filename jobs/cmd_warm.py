"""``prewarm plan``, ``prewarm warm`` and ``prewarm wal status|recover``.

``prewarm plan --from DIR|records.parquet --engine NAME [--budget-items N] [--budget-tokens T]
[--out plan.json]`` builds a plan from ingested records. ``prewarm warm --plan plan.json`` (or
``--from ... --engine NAME``) submits it to the workers and follows its progress.
``prewarm wal status`` lists open transactions; ``prewarm wal recover`` rolls back those whose
lease expired (the same sweep beat runs).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from jobs.locations import check_output, local_inputs, local_output
from jobs.option_checks import FORECASTS, one_of
from pipeline.errors import BadInputError
from pipeline.planner.plan import WarmPlan, new_plan_id
from tasks.settings import Settings, current_settings

console = Console()
Opt = typer.Option
FromOpt = Annotated[
    str | None,
    Opt("--from", help="Ingest output DIR (records.parquet) or a records.parquet (or a URL)."),
]
EngineOpt = Annotated[str | None, Opt("--engine", help="Configured engine name.")]


def _engine_name(settings: Settings, name: str | None) -> str:
    if name:
        return settings.engine(name).name
    if len(settings.engines) == 1:
        return settings.engines[0].name
    raise BadInputError("name one with --engine", where="engine")


def build_plan_from(
    source: str | Path, engine: str | None, *, budget_items: int | None = None,
    budget_tokens: int | None = None, batch_size: int | None = None, shapes: bool = False,
    forecast: str = "auto",
) -> WarmPlan:  # fmt: skip
    """A plan for a configured engine from ingested records (what ``prewarm plan`` prints); the
    requests its gateways' clients repeat are candidates too."""
    from tasks.adapters.model_shelf import checked_out
    from tasks.adapters.store import store_client
    from tasks.services.fleets import fleet_settings
    from tasks.services.planning import (
        gateway_candidates_noted,
        plan_for,
        plan_request,
        read_records,
    )

    settings = fleet_settings(current_settings(), store_client(current_settings()))
    with (
        local_inputs([str(source)], settings.host_dir) as (local,),
        checked_out(settings.data_dir, None, settings.host_dir) as root,
    ):
        records, windows = read_records(local)
        request = plan_request(
            settings, _engine_name(settings, engine), max_items=budget_items,
            max_tokens=budget_tokens, batch_size=batch_size, shapes=shapes,
        )  # fmt: skip
        engine_settings = settings.engine(request.engine)
        gateway_items, notes, _ = gateway_candidates_noted(settings, request.engine, records)
        plan = plan_for(records, request, reason="cli", windows=windows, forecast=forecast,
                        engine=engine_settings, models_root=root,
                        min_windows=settings.loop.min_windows_for_model,
                        extra=gateway_items)  # fmt: skip
        return replace(plan, notes=(*plan.notes, *notes)) if notes else plan


def _plan_table(plan: WarmPlan, limit: int = 20) -> Table:
    table = Table(title=f"plan {plan.plan_id} for {plan.engine} (priming order)")
    for column in ("#", "kind", "tenant", "tokens", "hits", "score", "key"):
        table.add_column(column, justify="right" if column in ("#", "tokens") else "left")
    shown = plan.items[-limit:]
    for n, item in enumerate(shown, start=len(plan.items) - len(shown) + 1):
        table.add_row(str(n), item.kind, item.tenant, str(item.tokens),
                      f"{item.predicted_hits:.1f}", f"{item.score:.3f}", item.key[:40])  # fmt: skip
    return table


def plan(
    source: FromOpt = None,
    engine: EngineOpt = None,
    budget_items: Annotated[int | None, Opt(min=1, help="At most this many items.")] = None,
    budget_tokens: Annotated[int | None, Opt(min=1, help="Token budget (cache capacity).")] = None,
    batch_size: Annotated[int | None, Opt(min=1, help="Items per batch (transaction).")] = None,
    shapes: Annotated[bool, Opt(help="Add one request per workload shape.")] = False,
    forecast: Annotated[
        str, Opt(help="auto | model | frequency", callback=one_of(FORECASTS))
    ] = "auto",
    out: Annotated[
        str | None, Opt("--out", help="Write the plan JSON here (a path or a URL).")
    ] = None,
) -> None:
    """Build a warm-up plan from ingested request records."""
    if source is None:
        raise BadInputError("--from DIR or records.parquet is required", where="--from")
    check_output(out, folder=False)
    built = build_plan_from(source, engine, budget_items=budget_items, budget_tokens=budget_tokens,
                            batch_size=batch_size, shapes=shapes, forecast=forecast)  # fmt: skip
    console.print(_plan_table(built))
    console.print(f"{len(built.items)} items, {built.tokens} tokens, {built.dropped} dropped; "
                  + "; ".join(built.notes), highlight=False)  # fmt: skip
    if out is not None:
        with local_output(out, folder=False) as path:
            path.write_text(built.to_json())
        console.print(f"plan written to {out}", highlight=False)


def _load_plan(path: Path) -> WarmPlan:
    try:
        return WarmPlan.from_json(path.read_text(), where=str(path))
    except OSError as exc:
        raise BadInputError(f"cannot read plan ({exc.strerror})", where=str(path)) from exc


def outcome(
    report: dict[str, Any], batches: list[dict[str, Any]], elapsed_s: float
) -> dict[str, Any]:
    """What ``prewarm warm`` prints: the plan's report as the CLI saw it end.

    A plan whose batches are all done is ``finished`` (the store says ``submitted`` until the
    chord's callback runs, and again when a finished plan is submitted once more); its seconds
    are the store's when they are sound, else what this command waited (never negative: a
    re-submitted plan keeps its first ``finished`` time). ``ok`` is false when an item failed or
    a batch rolled back, and ``failed_batches`` says which.
    """
    out = dict(report)
    if out.get("done"):
        out["state"] = "finished"
    seconds = out.get("seconds")
    if not isinstance(seconds, int | float) or seconds < 0:
        out["seconds"] = round(max(0.0, elapsed_s), 3)
    failed = [
        {"batch": b.get("batch"), "state": b.get("state"), "failed": b.get("failed", 0),
         "failures": b.get("failures", [])}
        for b in batches
        if b.get("state") != "committed" or b.get("failed", 0)
    ]  # fmt: skip
    out["failed_batches"] = failed
    out["ok"] = bool(out.get("done")) and not failed and not out.get("items_failed", 0)
    return out


def _follow(plan_id: str, timeout_s: float) -> dict[str, Any]:
    from tasks.warm_tasks import plan_report

    report = plan_report(plan_id)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[detail]}"), TimeElapsedColumn())  # fmt: skip
    deadline = time.monotonic() + timeout_s
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(f"plan {plan_id}", total=report["batches"], detail="")
        while not report["done"] and time.monotonic() < deadline:
            time.sleep(0.2)
            report = plan_report(plan_id)
            detail = (f"committed {report['committed']}  rolled back {report['rolled_back']}  "
                      f"items ok {report['items_ok']} failed {report['items_failed']}")  # fmt: skip
            progress.update(task, completed=report["batches_done"], detail=detail)
    return report


def warm(
    plan_file: Annotated[
        Path | None, Opt("--plan", help="A plan JSON from `prewarm plan`.")
    ] = None,
    source: FromOpt = None,
    engine: EngineOpt = None,
    budget_items: Annotated[int | None, Opt(min=1)] = None,
    budget_tokens: Annotated[int | None, Opt(min=1)] = None,
    ordered: Annotated[
        bool | None,
        Opt(
            "--ordered/--parallel",
            help="Batches one after another (default: when the plan "
            "has a token budget, since an LRU keeps what was primed last).",
            show_default=False,
        ),
    ] = None,
    wait: Annotated[bool, Opt(help="Follow progress until the plan is done.")] = True,
    timeout_s: Annotated[float, Opt(min=1)] = 600.0,
    queue: Annotated[str | None, Opt(help="Queue of a dedicated warm-up pool.")] = None,
) -> None:
    """Submit a plan to the workers and follow its progress."""
    from tasks.adapters.targets.base import WarmOptions
    from tasks.warm_tasks import submit_plan

    if plan_file is not None:
        # Each run of the command is a submission of its own: run again (after a restart) it
        # sends again. Idempotency protects one submission's redelivered batches, by this id.
        warm_plan = replace(_load_plan(plan_file), plan_id=new_plan_id())
    elif source is not None:
        warm_plan = build_plan_from(
            source, engine, budget_items=budget_items, budget_tokens=budget_tokens
        )
    else:
        raise BadInputError("give --plan FILE or --from DIR --engine NAME", where="prewarm warm")
    settings = current_settings()
    name = _engine_name(settings, engine or warm_plan.engine)
    if ordered is None:
        ordered = warm_plan.budget.max_tokens is not None
    options = WarmOptions(batch_size=warm_plan.budget.batch_size, ordered=ordered)
    started = time.monotonic()
    plan_id = submit_plan(replace(warm_plan, engine=name), name, options=options, queue=queue)
    console.print(f"submitted plan {plan_id}: {len(warm_plan.items)} items", highlight=False)
    if wait:
        from tasks.warm_tasks import batch_results

        report = _follow(plan_id, timeout_s)
        report = outcome(report, batch_results(plan_id), time.monotonic() - started)
        console.print_json(json.dumps(report))
        if not report["ok"]:  # not done, an item failed or a batch rolled back
            # SystemExit, not typer.Exit: click run with standalone_mode=False (jobs.cli) turns
            # an Exit into a return value that the console script drops
            raise SystemExit(1)


WAL_COLUMNS = ("txn", "plan", "batch", "engine", "state", "lease_left_s", "effects", "irreversible")
wal_app = typer.Typer(help="The warm-up write-ahead log.", no_args_is_help=True)


@wal_app.command("status")
def wal_status() -> None:
    """Open transactions, their lease and their effects."""
    from tasks.warm_tasks import wal_status as status

    summary = status()
    table = Table(title=f"{summary['open']} open transaction(s)")
    for column in WAL_COLUMNS:
        table.add_column(column, no_wrap=column in ("txn", "plan"))
    for row in summary["transactions"]:
        table.add_row(*(str(row[c]) for c in WAL_COLUMNS))
    console.print(table)


@wal_app.command("recover")
def wal_recover() -> None:
    """Roll back every transaction whose lease expired and resume the plans whose worker died
    (the recovery sweep, run here)."""
    from tasks.warm_tasks import recover_and_resume

    result = recover_and_resume()
    swept, resumed = result["rolled_back"], result["resumed"]
    listed = ": " + ", ".join(swept) if swept else ""
    console.print(f"rolled back {len(swept)} transaction(s){listed}", highlight=False)
    plans = ", ".join(f"{r['plan']} (from batch {r['from_batch']})" for r in resumed)
    console.print(f"resumed {len(resumed)} plan(s)" + (f": {plans}" if plans else ""))


def register(app: typer.Typer) -> None:
    """Add ``plan``, ``warm`` and ``wal`` to the CLI."""
    app.command("plan")(plan)
    app.command("warm")(warm)
    app.add_typer(wal_app, name="wal")
