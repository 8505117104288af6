"""The ``prewarm`` command line.

Each command group lives in its own module under ``jobs/`` and registers itself here; a
:class:`PrewarmError` (bad settings, bad input, an unreachable server) ends the run with one
clear line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pipeline.errors import BadInputError, PrewarmError

app = typer.Typer(
    name="prewarm",
    help="Warm the caches of an LLM serving fleet before traffic needs them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
err_console = Console(stderr=True, soft_wrap=True)  # one error, one line, at any width

#: Modules under jobs/ that each define ``register(app)``.
COMMAND_MODULES: list[str] = [
    "jobs.simulator.cli",
    "jobs.services",
    "jobs.checks",
    "jobs.demo",
    "jobs.watchers",
    "jobs.templates_cli",
    "jobs.cmd_ingest",
    "jobs.cmd_warm",
    "jobs.cmd_evaluate",
    "jobs.cmd_status",
]


@app.callback()
def _root(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML settings file (or PREWARM_CONFIG).")
    ] = None,
) -> None:
    if config is not None:
        import os

        os.environ["PREWARM_CONFIG"] = str(config)


def _register_commands() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


def _one_line(exc: BaseException) -> str:
    kind = "bad input" if isinstance(exc, BadInputError) else "error"
    return f"prewarm: {kind}: {exc}"


def _translated(exc: Exception) -> PrewarmError | None:
    """prewarm's error for a Redis/broker/HTTP connection failure that escaped a command."""
    from tasks.connections import translate_connection_error
    from tasks.settings import current_settings

    try:
        settings = current_settings()
    except PrewarmError:
        settings = None
    return translate_connection_error(exc, settings)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    _register_commands()
    try:
        app(args=argv, standalone_mode=False)
    except PrewarmError as exc:
        err_console.print(_one_line(exc), markup=False, highlight=False)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("prewarm: aborted", markup=False)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        translated = _translated(exc)
        if translated is not None:
            err_console.print(_one_line(translated), markup=False, highlight=False)
            sys.exit(2)

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise
