"""``prewarm store copy SRC DST``: copy the shared state of a ``data_dir`` (a folder or an
``s3://`` URL) into another, and check each object arrived whole (its SHA-256 read back).
The way an installation moves from one volume to a bucket, and back."""

from __future__ import annotations

import json
from typing import Annotated

import typer

store_app = typer.Typer(help="The shared store (data_dir): move it between a folder and a bucket.",
                        no_args_is_help=True)  # fmt: skip


@store_app.command("copy")
def copy(
    source: Annotated[str, typer.Argument(help="The data_dir to copy: a folder or a URL.")],
    target: Annotated[str, typer.Argument(help="Where to: a folder or a URL.")],
) -> None:
    """Copy shared state (observations, models, KV-event state) and check every object."""
    from tasks.adapters.shared_store import shared_store
    from tasks.adapters.store_copy import copy_shared_state

    report = copy_shared_state(shared_store(source), shared_store(target))
    typer.echo(json.dumps(report.to_dict()))


@store_app.command("check")
def check(
    url: Annotated[
        str | None, typer.Argument(help="A folder or URL (default: the configured data_dir).")
    ] = None,
    create: Annotated[
        bool, typer.Option("--create", help="Make the bucket (or folder) first if missing.")
    ] = False,
) -> None:
    """Write, read back and remove a probe object: the store answers (exit 1 when not)."""
    from tasks.adapters.shared_store import shared_store
    from tasks.settings import current_settings

    typer.echo(json.dumps(shared_store(url or current_settings().data_dir).check(create)))


def register(app: typer.Typer) -> None:
    """Add ``prewarm store``."""
    app.add_typer(store_app, name="store")
