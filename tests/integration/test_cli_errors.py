"""What a new user sees when something is missing: one line naming it, and a non-zero exit.

Every case runs the real ``prewarm`` console script in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.embedded import free_port
from tests.conftest import SHARED_DATA
from tests.integration.processes import prewarm_script

pytestmark = pytest.mark.integration


def prewarm(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    return subprocess.run(
        [prewarm_script(), *args],
        env={**base, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_one_line(result, *fragments: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("command", [["worker"], ["beat"], ["api"], ["health", "redis"]])
def test_unreachable_redis_is_one_line(command, tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = prewarm(*command, env={"PREWARM_REDIS_URL": url}, cwd=tmp_path)
    assert_one_line(result, "cannot reach", url, "PREWARM_REDIS_URL")


def test_missing_config_file_is_one_line(tmp_path):
    missing = tmp_path / "nope.toml"
    assert_one_line(prewarm("--config", str(missing), "health", "redis"), str(missing), "not found")


def test_malformed_config_file_names_the_file(tmp_path):
    bad = tmp_path / "prewarm.toml"
    bad.write_text('redis_url = "redis://localhost:6379/0"\n[budget\nmax_items = 3\n')
    result = prewarm("health", "redis", env={"PREWARM_CONFIG": str(bad)})
    assert_one_line(result, str(bad), "not valid TOML", "line 2")


def test_invalid_setting_names_the_key(tmp_path):
    bad = tmp_path / "prewarm.toml"
    bad.write_text('[budget]\nmax_items = "lots"\n')
    assert_one_line(prewarm("-c", str(bad), "health", "redis"), "budget.max_items")


def test_invalid_environment_value_names_the_key():
    result = prewarm("health", "redis", env={"PREWARM_REDIS_URL": "http://localhost:6379"})
    assert_one_line(result, "redis_url", "redis://")


def test_unknown_engine_name_is_one_line(tmp_path):
    config = tmp_path / "prewarm.toml"
    config.write_text('[[engines]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodel = "m"\n')
    assert_one_line(prewarm("-c", str(config), "health", "engine", "b"), "unknown engine 'b'", "a")


def test_unreachable_engine_url_is_one_line():
    url = f"http://127.0.0.1:{free_port()}"
    assert_one_line(prewarm("health", "engine", url), "cannot reach engine", url)


def test_unknown_queue_is_one_line():
    assert_one_line(prewarm("worker", "--queues", "warm,nope"), "--queues", "nope")


@pytest.fixture(scope="module")
def ingested(tmp_path_factory) -> Path:
    """An ingest output folder made from a real-format vLLM log, as a user would make it."""
    out = tmp_path_factory.mktemp("ingest")
    log = SHARED_DATA / "logs" / "examples" / "vllm-main-2026-08.txt"
    assert prewarm("ingest", str(log), "--out", str(out)).returncode == 0
    return out


def test_planning_for_an_unknown_engine_is_one_line(ingested, tmp_path):
    config = tmp_path / "prewarm.toml"
    config.write_text('[[engines]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodel = "m"\n')
    result = prewarm("-c", str(config), "plan", "--from", str(ingested), "--engine", "b")
    assert_one_line(result, "unknown engine 'b'")


def test_warming_without_redis_is_one_line(ingested, tmp_path):
    config = tmp_path / "prewarm.toml"
    config.write_text('[[engines]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodel = "m"\n')
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = prewarm(
        "-c", str(config), "warm", "--from", str(ingested), "--engine", "a",
        env={"PREWARM_REDIS_URL": url},
    )  # fmt: skip
    assert_one_line(result, "cannot reach", url)


def test_a_plan_written_where_it_cannot_be_is_one_line(ingested, tmp_path):
    config = tmp_path / "prewarm.toml"
    config.write_text('[[engines]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodel = "m"\n')
    plan = ["-c", str(config), "plan", "--from", str(ingested), "--engine", "a", "--out"]
    folder = prewarm(*plan, str(tmp_path))  # a folder, not a file: the option's mistake
    assert_one_line(folder, "prewarm plan: usage:", "--out", "is a directory")
    assert folder.returncode == 2
    missing = tmp_path / "no-such-folder" / "plan.json"  # the system refuses the write
    refused = prewarm(*plan, str(missing))
    assert_one_line(refused, "prewarm plan: error:", str(missing), "No such file or directory")
    assert refused.returncode == 1


# -- every command: usage mistakes ---------------------------------------------------------
def run_cases(tmp_path: Path, extra: list[dict]) -> dict[str, dict]:
    """Every command's usage cases plus ``extra``, run through the real entry point."""
    out, more = tmp_path / "results.json", tmp_path / "extra.json"
    more.write_text(json.dumps(extra))
    base = {k: v for k, v in os.environ.items() if not k.startswith("PREWARM_")}
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.cli_cases", str(out), str(more)],
        env={**base, "COLUMNS": "100"}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {
        " ".join(case["argv"]) + f" [{case['kind']}]": case for case in json.loads(out.read_text())
    }


def _inputs(tmp_path: Path) -> dict[str, Path]:
    empty = tmp_path / "empty"
    empty.mkdir()
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    control = tmp_path / "control.log"
    control.write_bytes(b"INFO \x1b[2J\x1b]0;pwned\x07 not a log line\x00\x9b\n" * 3)
    cut = tmp_path / "cut.parquet"  # a Parquet file cut short: its magic, no footer
    cut.write_bytes(b"PAR1" + bytes(range(64)))
    empty_file = tmp_path / "nothing.log"
    empty_file.write_bytes(b"")
    return {
        "empty": empty,
        "binary": binary,
        "control": control,
        "cut": cut,
        "empty file": empty_file,
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("cli")
    paths = _inputs(tmp)
    out, empty = str(tmp / "out"), str(paths["empty"])
    extra = [
        {"kind": "version", "argv": ["--version"]},
        {"kind": "ingest no out", "argv": ["ingest", empty]},
        {"kind": "bad window", "argv": ["ingest", empty, "--out", out, "--window", "bogus"]},
        {"kind": "bad workers", "argv": ["ingest", empty, "--out", out, "--workers", "-3"]},
        {"kind": "bad eval window", "argv": ["evaluate", empty, "--window", "bogus"]},
        {"kind": "bad forecast", "argv": ["plan", "--from", empty, "--forecast", "bogus"]},
        {"kind": "empty folder", "argv": ["ingest", empty, "--out", out]},
        {"kind": "empty file", "argv": ["ingest", str(paths["empty file"]), "--out", out]},
        {"kind": "binary", "argv": ["ingest", str(paths["binary"]), "--out", out]},
        {"kind": "control", "argv": ["ingest", str(paths["control"]), "--out", out]},
        {"kind": "out is a file",
         "argv": ["ingest", str(paths["control"]), "--out", str(paths["binary"])]},
        {"kind": "out under a file",
         "argv": ["ingest", str(paths["control"]), "--out", str(paths["binary"] / "out")]},
        {"kind": "report into a folder", "argv": ["report", "--out", empty]},
        {"kind": "evaluate a cut table", "argv": ["evaluate", str(paths["cut"])]},
        {"kind": "state under a file", "argv": ["ingest", str(paths["control"]), "--out", out,
                                                "--state", str(paths["binary"] / "state.json")]},
        {"kind": "state is a folder",
         "argv": ["ingest", str(paths["control"]), "--out", out, "--state", empty]},
    ]  # fmt: skip
    return run_cases(tmp, extra)


def _no_traceback(case: dict) -> None:
    assert "Traceback" not in case["stdout"] + case["stderr"], case


def test_every_command_answers_h_with_its_help(results):
    helps = [c for c in results.values() if c["kind"] == "help"]
    assert len(helps) >= 20  # the tree walk found the commands, groups and subcommands
    for case in helps:
        _no_traceback(case)
        assert case["code"] == 0, case
        assert "Usage:" in case["stdout"], case


def test_every_command_refuses_an_unknown_option_in_one_line(results):
    for case in (c for c in results.values() if c["kind"] == "unknown option"):
        _no_traceback(case)
        assert case["code"] == 2, case
        lines = case["stderr"].strip().splitlines()
        assert len(lines) == 1 and "--no-such-option-anywhere" in lines[0], case
        assert lines[0].startswith("prewarm"), case


def test_every_missing_argument_is_one_line_or_the_help(results):
    missing = [c for c in results.values() if c["kind"] in ("missing", "bare group")]
    assert any(c["kind"] == "bare group" and c["argv"] == [] for c in missing)  # bare `prewarm`
    for case in missing:
        _no_traceback(case)
        assert case["code"] == 2, case
        if case["kind"] == "bare group":
            assert "Usage:" in case["stdout"] and "Commands" in case["stdout"], case
        else:
            lines = case["stderr"].strip().splitlines()
            assert len(lines) == 1 and ("Missing" in lines[0] or "requires" in lines[0]), case
            # the line names the command itself, also where the option parser raised it
            command = " ".join(["prewarm", *(w for w in case["argv"] if not w.startswith("-"))])
            assert lines[0].startswith(f"{command}: usage: "), case


def _one(results: dict[str, dict], kind: str) -> dict:
    (case,) = [c for c in results.values() if c["kind"] == kind]
    _no_traceback(case)
    return case


def test_version_and_h(results):
    case = _one(results, "version")
    assert case["code"] == 0 and case["stdout"].startswith("prewarm ") and case["stdout"].strip()


@pytest.mark.parametrize(
    ("kind", "fragments"),
    [
        ("ingest no out", ["prewarm ingest", "--out"]),
        ("bad window", ["--window", "bogus"]),
        ("bad workers", ["--workers"]),
        ("bad eval window", ["--window", "bogus"]),
        ("bad forecast", ["prewarm plan", "--forecast", "bogus"]),
        ("empty folder", ["nothing to read", "no files"]),
        ("empty file", ["nothing to read", "empty file", "nothing.log"]),
        ("binary", ["nothing to read", "format"]),
        ("control", ["nothing to read"]),
        ("out is a file", ["prewarm ingest", "--out", "is a file"]),
        ("out under a file", ["--out", "blob.bin", "cannot create the folder"]),
        ("state under a file", ["--state", "blob.bin", "cannot create the folder"]),
        ("state is a folder", ["prewarm ingest", "--state", "is a directory"]),
        ("report into a folder", ["prewarm report", "--out", "is a directory"]),
        ("evaluate a cut table", ["cut.parquet", "cannot read counts"]),
    ],
)
def test_bad_values_and_nothing_to_read_are_one_line_exit_2(results, kind, fragments):
    case = _one(results, kind)
    assert case["code"] == 2, case
    lines = case["stderr"].strip().splitlines()
    assert len(lines) == 1, case
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_reject_samples_print_control_bytes_escaped(results):
    case = _one(results, "control")
    assert "\x1b" not in case["stdout"] and "\x07" not in case["stdout"]
    assert "\\x1b[2J" in case["stdout"] and "\\x07" in case["stdout"], case["stdout"]
