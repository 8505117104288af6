"""Runs ``prewarm`` usage cases for every command of the CLI, each in a forked child process.

``python -m tests.integration.cli_cases OUT.json [EXTRA.json]`` walks the click command tree
(so a command added later is covered without editing a list), builds per command: ``-h``, an
unknown option, and a missing argument (no arguments where one is required, else a value option
with its value left off), adds the cases of EXTRA.json (``[{"kind": ..., "argv": [...]}]``),
runs each through ``jobs.cli.main`` in a child forked from this process (imports are paid
once), and writes each case's argv, exit status, stdout and stderr to OUT.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from jobs.cli import PROG, command_tree, main

UNKNOWN = "--no-such-option-anywhere"


def walk(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every command and group under ``command`` with its argv path."""
    found = [(path, command)]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        found.extend(walk(sub, (*path, name)))
    return found


def _value_option(command: Any) -> str | None:
    for param in command.params:
        if param.param_type_name != "option":  # (an optional argument has no flag to leave out)
            continue
        takes_value = not (param.is_flag or param.count or param.is_eager)
        if takes_value and param.opts[0].startswith("--"):
            return str(param.opts[0])
    return None


def missing_case(path: tuple[str, ...], command: Any) -> tuple[str, ...] | None:
    """argv that leaves a required value out, or None when the command takes none."""
    if getattr(command, "commands", None) is not None:
        return path  # a bare group: its help, exit 2
    if any(param.required for param in command.params):
        return path
    option = _value_option(command)
    return (*path, option) if option else None


def cases() -> list[dict[str, Any]]:
    """Every case to run, with what kind of case it is."""
    out = []
    for path, command in walk(command_tree()):
        out.append({"kind": "help", "argv": [*path, "-h"]})
        out.append({"kind": "unknown option", "argv": [*path, UNKNOWN]})
        missing = missing_case(path, command)
        if missing is not None:
            group = getattr(command, "commands", None) is not None
            out.append({"kind": "bare group" if group else "missing", "argv": list(missing)})
    return out


def run_case(argv: list[str], work: Path) -> dict[str, Any]:
    """Run ``prewarm ARGV`` in a forked child; its exit status and output."""
    out, err = work / "stdout", work / "stderr"
    pid = os.fork()
    if pid == 0:  # the child: the real entry point, with stdout/stderr into files
        sys.stdout.flush()
        sys.stderr.flush()
        with open(out, "wb") as o, open(err, "wb") as e:
            os.dup2(o.fileno(), 1)
            os.dup2(e.fileno(), 2)
        code = 0
        try:
            sys.argv = [PROG, *argv]
            main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # a traceback is what the test looks for
            import traceback

            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return {
        "argv": argv,
        "code": os.waitstatus_to_exitcode(status),
        "stdout": out.read_text(errors="replace"),
        "stderr": err.read_text(errors="replace"),
    }


def run_all(path: Path, extra: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
    """Run every case (and ``extra`` ones) and write the results as JSON to ``path``."""
    results = []
    with tempfile.TemporaryDirectory(prefix="prewarm-cli-cases-") as work:
        for case in [*cases(), *extra]:
            results.append({**case, **run_case(case["argv"], Path(work))})
    path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    more = json.loads(Path(sys.argv[2]).read_text()) if len(sys.argv) > 2 else []
    run_all(Path(sys.argv[1]), more)
