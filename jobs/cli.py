"""The ``prewarm`` command line.

Each command group lives in its own module under ``jobs/`` and registers itself here; a
:class:`PrewarmError` (bad settings, bad input, an unreachable server) ends the run with one
clear line on stderr and exit 2, never a traceback. A usage mistake (a missing argument, an
unknown option, a value an option refuses) is one line naming the command and exit 2; a bare
group (``prewarm``, ``prewarm wal``) prints its help on stderr and exits 2. ``-h`` is ``--help``
everywhere; ``prewarm --version`` prints the installed version.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Annotated

import click
import typer
from rich.console import Console

# typer 0.2x ships its own copy of click and raises that copy's exceptions; the standalone
# click package raises its own. Both are caught, as the same kinds.
from typer._click import exceptions as typer_click
from typer._click.core import Command as ClickCommand

from pipeline.errors import BadInputError, PrewarmError

app = typer.Typer(
    name="prewarm",
    help="Warm the caches of an LLM serving fleet before traffic needs them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
PROG = "prewarm"
USAGE_ERRORS: tuple[type[Exception], ...] = (typer_click.UsageError, click.UsageError)
CLICK_ERRORS: tuple[type[Exception], ...] = (typer_click.ClickException, click.ClickException)
BARE_GROUP: tuple[type[Exception], ...] = (
    typer_click.NoArgsIsHelpError,
    click.exceptions.NoArgsIsHelpError,
)
err_console = Console(stderr=True, soft_wrap=True)  # one error, one line, at any width

#: Modules under jobs/ that each define ``register(app)``, with the top-level commands each
#: registers (a run names one: only its module is imported, ~1 s less for ``prewarm ingest``)
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "jobs.simulator.cli": ("simulator",),
    "jobs.cmd_services": ("api", "worker", "beat", "flower"),
    "jobs.cmd_health": ("health",),
    "jobs.demo": ("demo",),
    "jobs.cmd_watch": ("watch",),
    "jobs.cmd_gate": ("gate",),
    "jobs.cmd_templates": ("templates",),
    "jobs.cmd_ingest": ("ingest",),
    "jobs.cmd_warm": ("plan", "warm", "wal"),
    "jobs.cmd_evaluate": ("evaluate",),
    "jobs.cmd_kv_events": ("kv-events",),
    "jobs.report": ("report",),
    "jobs.cmd_status": ("status",),
    "jobs.cmd_store": ("store",),
}
#: settings a command's process wants of the libraries its module loads: read once, when a
#: library loads, so set before the module is imported (a value the caller set is kept).
#: Arrow's allocator (mimalloc) gives freed pages back to the system after a delay, and the
#: next chunk's buffers fault them in again: a 1 GB vLLM ingest on 2 cores had ~300k minor
#: faults, ~150k with them kept (and 1-2 s less system time). An ingest's process ends with
#: its run (see pipeline.ingest.heap), so it keeps them.
COMMAND_ENVIRONMENT: dict[str, dict[str, str]] = {"ingest": {"MIMALLOC_PURGE_DELAY": "-1"}}
#: root options that take a value (the command is the first word after them)
_ROOT_VALUE_OPTIONS = ("--config", "-c")


def version() -> str:
    """The installed prewarm distribution's version ("unknown" when run from a bare checkout)."""
    try:
        return metadata.version("prewarm")
    except metadata.PackageNotFoundError:
        return "unknown"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"{PROG} {version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML settings file (or PREWARM_CONFIG).")
    ] = None,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_show_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    if config is not None:
        os.environ["PREWARM_CONFIG"] = str(config)


_registered: list[str] = []


def _register_commands(argv: list[str] | None = None) -> None:
    """Add the command modules' commands to ``app``, once per process: only the module of the
    command ``argv`` names, or every module (no command, an unknown one, ``None``: the help
    lists them all, and a typo gets its suggestions). The named command's
    :data:`COMMAND_ENVIRONMENT` is set first."""
    named = _command_named(argv) if argv is not None else None
    for name, value in COMMAND_ENVIRONMENT.get(named or "", {}).items():
        os.environ.setdefault(name, value)
    modules = [m for m, names in COMMAND_MODULES.items() if named in names] or COMMAND_MODULES
    for name in modules:
        if name not in _registered:
            importlib.import_module(name).register(app)
            _registered.append(name)


def _command_named(argv: list[str]) -> str | None:
    """The top-level command ``argv`` names: its first word that is not a root option."""
    words = iter(argv)
    for word in words:
        if word in _ROOT_VALUE_OPTIONS:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def command_path(argv: Sequence[str]) -> str:
    """``prewarm`` and the (sub)commands ``argv`` names, as click prints a command's path:
    each word that names a subcommand of the group before it, options skipped."""
    group, path = typer.main.get_command(app), [PROG]
    words = iter(argv)
    for word in words:
        if word in _ROOT_VALUE_OPTIONS and len(path) == 1:
            next(words, None)
            continue
        if word.startswith("-"):
            continue
        sub = getattr(group, "commands", {}).get(word)
        if sub is None:
            break
        group = sub
        path.append(word)
    return " ".join(path)


def command_tree() -> ClickCommand:
    """The click command of the whole CLI, every command registered (for tests and docs)."""
    _register_commands()
    return typer.main.get_command(app)


def _one_line(exc: BaseException) -> str:
    kind = "bad input" if isinstance(exc, BadInputError) else "error"
    return f"prewarm: {kind}: {exc}"


def _translated(exc: Exception) -> PrewarmError | None:
    """prewarm's error for a Redis/broker/HTTP connection failure that escaped a command."""
    from tasks.adapters.connections import translate_connection_error
    from tasks.settings import current_settings

    try:
        settings = current_settings()
    except PrewarmError:
        settings = None
    return translate_connection_error(exc, settings)


def usage_line(exc: Exception, argv: Sequence[str] = ()) -> str:
    """One line for a click usage error: the command, what is wrong, where the help is. An
    error the option parser raises has no context (an option left without its value): the
    command is then the one ``argv`` names."""
    ctx = getattr(exc, "ctx", None)
    command = ctx.command_path if ctx is not None else command_path(argv)
    message = " ".join(str(exc.format_message()).split())  # type: ignore[attr-defined]
    return f"{command}: usage: {message} (see '{command} -h')"


def file_error_line(exc: OSError, argv: Sequence[str] = ()) -> str:
    """One line for a file the system refused a command (a full disk, no permission): the
    command, the file, the system's reason."""
    reason = exc.strerror or type(exc).__name__
    return f"{command_path(argv)}: error: {exc.filename}: {reason}"


def _exit_code(exc: Exception) -> int:
    code = getattr(exc, "exit_code", 1)
    return code if isinstance(code, int) else 1


def _print_error(line: str) -> None:
    err_console.print(line, markup=False, highlight=False)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    args = sys.argv[1:] if argv is None else argv
    _register_commands(args)
    try:
        # (without standalone mode click returns a command's ``typer.Exit`` code instead of
        # exiting: ``prewarm status`` printed UNHEALTHY and exited 0)
        code = app(args=argv, prog_name=PROG, standalone_mode=False)
    except PrewarmError as exc:
        _print_error(_one_line(exc))
        sys.exit(2)
    except (typer.Abort, click.Abort, KeyboardInterrupt):
        _print_error(f"{PROG}: aborted")
        sys.exit(130)
    except (typer.Exit, click.exceptions.Exit) as exc:
        sys.exit(exc.exit_code)
    except BARE_GROUP:  # typer has printed the group's help already
        sys.exit(2)
    except USAGE_ERRORS as exc:
        _print_error(usage_line(exc, args))
        sys.exit(2)
    except CLICK_ERRORS as exc:  # a file that cannot be opened, and the like
        _print_error(f"{PROG}: error: {' '.join(str(exc.format_message()).split())}")  # type: ignore[attr-defined]
        sys.exit(_exit_code(exc) or 1)
    except Exception as exc:  # a connection failure that escaped a command
        translated = _translated(exc)
        if translated is not None:
            _print_error(_one_line(translated))
            sys.exit(2)
        if not isinstance(exc, OSError) or exc.filename is None:
            raise
        _print_error(file_error_line(exc, args))  # a full disk, a file it may not write
        sys.exit(1)
    if isinstance(code, int) and code:
        sys.exit(code)
