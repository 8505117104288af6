"""``prewarm ingest``: logs and traces -> records, windows and engine metrics as Parquet.

``prewarm ingest PATH... --out DIR`` writes ``DIR/records.parquet`` (canonical RequestRecord
columns), ``DIR/windows.parquet`` (item × window counts with lag/rolling features),
``DIR/counts.parquet`` (every item's counts) and ``DIR/metrics.parquet`` (vLLM stats lines),
then prints a summary per file (``--json``: the summary as one JSON object). ``--state FILE``
makes runs incremental: each file is read from where the previous run stopped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn
from rich.table import Table

from jobs import option_checks
from jobs.locations import check_inputs, check_output, local_inputs, local_output
from pipeline.errors import BadInputError
from pipeline.ingest import IngestOptions, IngestState, ingest_to_dir
from pipeline.ingest.detect import FORMATS
from pipeline.ingest.heap import keep_freed_memory
from pipeline.prefix_blocks import DEFAULT_BLOCK_SIZE

#: below this many bytes a progress bar only flickers
PROGRESS_MIN_BYTES = 64 << 20


def _default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def _total_bytes(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        if path.is_file():
            total += path.stat().st_size
        elif path.is_dir():
            total += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return total


def printable(text: str) -> str:
    """``text`` with control characters written as escapes (``\\x1b``), safe on a terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _folder(folder: Path, where: str) -> None:
    """Create ``folder`` and its parents before any file is read (``where``: the option and
    value that need it): one that cannot be made (a file on its path, no permission) is the
    option's mistake, named in one line, and no run's work is lost to it at the end."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        message = f"cannot create the folder {folder} ({reason})"
        raise BadInputError(message, where=where) from exc


def nothing_read(summary: dict[str, Any]) -> str | None:
    """Why a run found nothing prewarm can read (no files, or none in a known format), or None.

    A file of a known format with nothing new in it (an incremental run) is not an error; an
    empty file is no known format: nothing in it can be read.
    """
    files = summary["files"]
    if not files:
        return "no files found"
    if summary["records"] or summary["metrics"] or summary["windows"]:
        return None
    empty = [Path(entry["path"]).name for entry in files if entry["format"] == "empty"]
    if len(empty) == len(files):  # (named: a folder given may hold them)
        return f"empty file{'s' if len(empty) > 1 else ''} ({', '.join(empty)})"
    if all(entry["format"] in ("unknown", "empty") for entry in files):
        rejected = sum(sum(entry["rejected"].values()) for entry in files)
        return f"no file in a format prewarm reads ({len(files)} files, {rejected} lines rejected)"
    return None


def _print_table(console: Console, summary: dict[str, Any]) -> None:
    table = Table(title=f"ingested into {summary['out']}")
    for column in ("file", "format", "records", "metrics", "lines", "rejected", "ignored"):
        table.add_column(column, justify="left" if column in ("file", "format") else "right")
    for entry in summary["files"]:
        table.add_row(
            Path(entry["path"]).name, entry["format"], str(entry["records"]),
            str(entry["metrics"]), str(entry["lines"]), str(sum(entry["rejected"].values())),
            str(sum(entry["ignored"].values())),
        )  # fmt: skip
    console.print(table)
    for entry in summary["files"]:
        for reason, samples in entry["reject_samples"].items():
            console.print(f"[yellow]{reason}[/] ×{entry['rejected'][reason]}", highlight=False)
            for sample in samples:
                console.print(f"  {printable(sample)}", markup=False, highlight=False)
        for note in entry["assumptions"]:
            console.print(f"[dim]{Path(entry['path']).name}: {note}[/]", highlight=False)


def ingest(
    paths: Annotated[
        list[str], typer.Argument(help="Log or trace files and folders (paths or s3:// URLs).")
    ],
    out: Annotated[str, typer.Option("--out", "-o", help="Output folder (a path or a URL).")],
    fmt: Annotated[
        str | None,
        typer.Option(
            "--format",
            help=f"Override detection: {', '.join(FORMATS)}.",
            callback=option_checks.one_of(FORMATS),
        ),
    ] = None,
    year: Annotated[
        int | None,
        typer.Option(
            min=1970, max=9999, help="Year of the first vLLM entry (default: from mtime)."
        ),
    ] = None,
    tz: Annotated[
        str, typer.Option(help="Zone of vLLM timestamps.", callback=option_checks.timezone)
    ] = "UTC",
    block_size: Annotated[
        int, typer.Option(min=1, help="Tokens per prefix block.")
    ] = DEFAULT_BLOCK_SIZE,
    window: Annotated[
        str, typer.Option(help="Window length (pandas offset).", callback=option_checks.window)
    ] = "10min",
    max_log_len: Annotated[
        int | None, typer.Option(min=1, help="vLLM --max-log-len, when known.")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model name for log records.")] = None,
    min_item_requests: Annotated[
        int, typer.Option(min=1, help="Items with fewer requests get no feature rows.")
    ] = 2,
    workers: Annotated[
        int, typer.Option(min=0, help="Parallel processes (0: one per core, up to 8).")
    ] = 0,
    state: Annotated[
        Path | None,
        typer.Option(help="State file: read only what is new since the last run.", dir_okay=False),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Parse logs and traces into records, windows and engine metrics."""
    options = IngestOptions(
        year=year, tz=tz, block_size=block_size, format=fmt, window=window,
        max_log_len=max_log_len, model=model, workers=workers or _default_workers(),
        min_item_requests=min_item_requests,
    )  # fmt: skip
    check_inputs(paths)
    check_output(out, folder=True)
    with local_inputs(paths) as local_paths, local_output(out) as out_dir:
        _ingest(local_paths, out_dir, options, state, as_json)


def _ingest(
    paths: list[Path], out: Path, options: IngestOptions, state: Path | None, as_json: bool
) -> None:
    run_state = IngestState.load(state) if state is not None else None
    _folder(out, f"--out {out}")
    if state is not None:
        _folder(state.parent, f"--state {state}")
    keep_freed_memory()  # this process ends with the run (see pipeline.ingest.heap)
    console = Console(stderr=True)
    show = not as_json and console.is_terminal and _total_bytes(paths) >= PROGRESS_MIN_BYTES
    with Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(),
        TimeRemainingColumn(), console=console, disable=not show,
    ) as progress:  # fmt: skip
        task = progress.add_task("ingest", total=None)
        summary = ingest_to_dir(
            paths, out, options, run_state,
            lambda done, total: progress.update(task, completed=done, total=total),
        )  # fmt: skip
    if run_state is not None and state is not None:
        run_state.save(state)
    if as_json:
        typer.echo(json.dumps(summary, indent=1, ensure_ascii=False))
    else:
        _print_table(Console(), summary)
    empty = nothing_read(summary)
    if empty is not None:
        raise BadInputError(f"nothing to read: {empty}", where=", ".join(map(str, paths)))


def register(app: typer.Typer) -> None:
    """Add ``prewarm ingest`` to the CLI."""
    app.command("ingest")(ingest)
