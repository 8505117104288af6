"""``prewarm templates diff`` on a real repository."""

from __future__ import annotations

import json
import subprocess
import sys

import git
import pytest

from tests.conftest import REPO_ROOT, worker_env

pytestmark = pytest.mark.integration


def _prewarm(*args: str) -> subprocess.CompletedProcess:
    code = f"from jobs.cli import main; main({list(args)!r})"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
    )


def test_templates_diff_prints_the_classification(tmp_path):
    repo = git.Repo.init(tmp_path, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "T").set_value("user", "email", "t@example.com")
    (tmp_path / "a.jinja").write_text("Hello there {{ name }}")
    repo.git.add("--all")
    first = repo.index.commit("one").hexsha
    (tmp_path / "a.jinja").write_text("Hello there {{ name|title }}")
    repo.git.add("--all")
    repo.index.commit("two")
    done = _prewarm("templates", "diff", str(tmp_path), first, "HEAD")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [(c["kind"], c["template"]) for c in out["changes"]] == [("structural", "a.jinja")]
    assert out["warm"] == ["a.jinja"]
    bad = _prewarm("templates", "diff", str(tmp_path), "--upload-pack=x", "HEAD")
    assert bad.returncode != 0


def _repo(tmp_path, files: dict[str, str]) -> git.Repo:
    repo = git.Repo.init(tmp_path, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "T").set_value("user", "email", "t@example.com")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    repo.git.add("--all")
    repo.index.commit("one")
    return repo


def _one_line_exit_2(done: subprocess.CompletedProcess, *fragments: str) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_templates_show_and_diff_on_a_deeply_nested_template_print_one_line(tmp_path):
    repo = _repo(tmp_path, {"a.jinja": "Hello there {{ name }}"})
    first = repo.head.commit.hexsha
    (tmp_path / "deep.jinja").write_text("{% if x %}" * 20_000 + "{% endif %}" * 20_000)
    repo.git.add("--all")
    repo.index.commit("two")
    shown = _prewarm("templates", "show", str(tmp_path))
    _one_line_exit_2(shown, "deep.jinja:1", "nested deeper")
    assert [t["template"] for t in json.loads(shown.stdout)["templates"]] == ["a.jinja"]
    diffed = _prewarm("templates", "diff", str(tmp_path), first, "HEAD")
    _one_line_exit_2(diffed, "deep.jinja:1")


def test_templates_show_on_a_tree_entry_named_dotdot_prints_one_line(tmp_path):
    repo = _repo(tmp_path, {"a.jinja": "Hello there {{ name }}"})

    def run(*args: str, stdin: str = "") -> str:
        return subprocess.run(
            ["git", *args], cwd=tmp_path, input=stdin, capture_output=True, text=True, check=True
        ).stdout.strip()

    blob = run("hash-object", "-w", "a.jinja")
    inner = run("mktree", stdin=f"100644 blob {blob}\tevil.jinja\n")
    tree = run("mktree", stdin=f"100644 blob {blob}\ta.jinja\n040000 tree {inner}\t..\n")
    run("update-ref", "refs/heads/main", run("commit-tree", tree, "-p", "HEAD", "-m", "dotdot"))
    first = repo.head.commit.parents[0].hexsha
    _one_line_exit_2(_prewarm("templates", "show", str(tmp_path)), "cannot be read safely")
    _one_line_exit_2(_prewarm("templates", "diff", str(tmp_path), first, "HEAD"), "..")
