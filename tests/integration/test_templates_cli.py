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
