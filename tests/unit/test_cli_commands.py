"""The CLI imports only the module of the command a run names."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import typer

from jobs.cli import COMMAND_MODULES, _command_named


@pytest.mark.parametrize("module", sorted(COMMAND_MODULES))
def test_each_module_registers_the_commands_listed_for_it(module: str) -> None:
    app = typer.Typer()
    importlib.import_module(module).register(app)
    names = [c.name or c.callback.__name__ for c in app.registered_commands if c.callback]
    names += [g.name for g in app.registered_groups if g.name]
    assert sorted(names) == sorted(COMMAND_MODULES[module])


def test_no_command_is_listed_twice() -> None:
    names = [n for listed in COMMAND_MODULES.values() for n in listed]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["ingest", "x.log"], "ingest"),
        (["-c", "p.toml", "ingest"], "ingest"),
        (["--config", "p.toml", "wal", "list"], "wal"),
        (["--config=p.toml", "status"], "status"),
        (["--version"], None),
        ([], None),
        (["-c"], None),
    ],
)
def test_the_command_named_is_the_first_word_after_the_root_options(
    argv: list[str], named: str | None
) -> None:
    assert _command_named(argv) == named


def _imported_after(argv: list[str]) -> set[str]:
    code = (
        "import sys\nfrom jobs.cli import main\ntry:\n"
        f"    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'jobs'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_prewarm_ingest_imports_neither_celery_nor_other_commands() -> None:
    imported = _imported_after(["ingest", "-h"])
    assert "jobs.cmd_ingest" in imported
    assert not {m for m in imported if m.startswith("celery")}
    assert not imported & {m for m in COMMAND_MODULES if m != "jobs.cmd_ingest"}


def test_an_unknown_command_registers_every_module_for_its_suggestions() -> None:
    assert set(COMMAND_MODULES) <= _imported_after(["ingst"])
