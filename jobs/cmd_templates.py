"""``prewarm templates``: what changed between two commits and what a re-warm would touch.

``REPO`` is a configured repository's name, or a path to a local git repository (read with the
default file patterns). Output is JSON, one object, so it can be piped. When a template file
is refused (over a size or nesting limit, a syntax error, a path leaving the repository), the
JSON still lists the others and its rejects, one line on stderr names the first refusal, and
the exit status is 2. A commit git cannot read safely (a tree entry ``..``) is one line, exit 2.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.errors import BadInputError
from pipeline.template_diff import Reject, TemplateChange, rewarm_set
from tasks.adapters.template_repos import TemplateRepo, local_repo_config
from tasks.settings import current_settings

templates_app = typer.Typer(help="Prompt templates in git repositories.", no_args_is_help=True)


def _mirror(repo: str, work_dir: Path) -> TemplateRepo:
    settings = current_settings()
    for config in settings.template_repos:
        if config.name == repo:
            return TemplateRepo(config, settings.host_dir)
    path = Path(repo)
    if not (path / ".git").exists() and not (path / "HEAD").exists():
        raise BadInputError(
            "neither a configured repository nor a local git repository", where=repo
        )
    return TemplateRepo(local_repo_config(path), work_dir)


def _refused(rejects: list[Reject]) -> None:
    """With rejects, one line naming the first on stderr and exit status 2."""
    if rejects:
        more = f" (and {len(rejects) - 1} more)" if len(rejects) > 1 else ""
        first = " ".join(rejects[0].reason.split())
        raise BadInputError(f"template refused: {first}{more}")


def _change(change: TemplateChange) -> dict[str, Any]:
    return {
        "kind": str(change.kind),
        "template": change.template_id,
        "from": change.old.template_id if change.old else None,
        "edit": str(change.edit) if change.edit else None,
        "version": change.new.version if change.new else None,
        "static_prefix": change.new.static_prefix if change.new else None,
    }


@templates_app.command("diff")
def diff(
    repo: Annotated[
        str, typer.Argument(help="Configured repository name or local repository path.")
    ],
    old: Annotated[str, typer.Argument(help="Old commit (sha, branch or tag).")],
    new: Annotated[str, typer.Argument(help="New commit (sha, branch or tag).")],
) -> None:
    """Classify every template change between OLD and NEW and print the re-warm set."""
    with tempfile.TemporaryDirectory(prefix="prewarm-templates-") as work:
        mirror = _mirror(repo, Path(work))
        mirror.sync()
        changes, rejects = mirror.changes(mirror.resolve(old), mirror.resolve(new))
    plan = rewarm_set(changes, rejects=rejects)
    summary = plan.summary()
    out = {**summary, "counts": summary["changes"], "changes": [_change(c) for c in changes]}
    typer.echo(json.dumps(out, indent=1, ensure_ascii=False))
    _refused(rejects)


@templates_app.command("show")
def show(
    repo: Annotated[
        str, typer.Argument(help="Configured repository name or local repository path.")
    ],
    ref: Annotated[str, typer.Argument(help="Commit to read (default: the branch head).")] = "",
) -> None:
    """List the templates at a commit with their fingerprints and static prefixes."""
    with tempfile.TemporaryDirectory(prefix="prewarm-templates-") as work:
        mirror = _mirror(repo, Path(work))
        head = mirror.sync()
        rejects: list[Reject] = []
        found = mirror.templates_at(mirror.resolve(ref) if ref else head, rejects)
    rows = [
        {"template": t.template_id, "kind": t.kind, "version": t.version,
         "structure": t.structure[:16], "static_prefix": t.static_prefix}
        for t in found.values()
    ]  # fmt: skip
    rejected = [{"path": r.path, "reason": r.reason} for r in rejects]
    typer.echo(json.dumps({"templates": rows, "rejects": rejected}, indent=1, ensure_ascii=False))
    _refused(rejects)


def register(app: typer.Typer) -> None:
    """Add ``prewarm templates``."""
    app.add_typer(templates_app, name="templates")
