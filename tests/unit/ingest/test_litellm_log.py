"""LiteLLM's request log as prewarm's callback writes it: lines captured from a real proxy
(litellm 1.108.7 in front of the simulator), bad lines, the gateway's candidates, settings."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from pipeline.errors import SettingsError
from pipeline.ingest import IngestOptions, ingest_paths
from pipeline.own_requests import own_mask
from pipeline.planner.gateway import gateway_items
from tasks.settings import load_settings
from tests.conftest import REPO_ROOT

GOLDEN = REPO_ROOT / "tests" / "data" / "ingest" / "litellm-requests.jsonl"


def _lines() -> list[dict]:
    return [json.loads(line) for line in GOLDEN.read_text().splitlines()]


def test_captured_lines_become_gateway_records_with_the_request_as_sent():
    result = ingest_paths([GOLDEN], IngestOptions())  # the format is detected
    records, lines = result.records, _lines()
    assert result.summary_dict()["files"][0]["format"] == "litellm-jsonl"
    assert len(records) == len(lines) and result.summary_dict()["rejected"] == 0
    assert set(records["source"]) == {"gateway"}
    assert list(records["cache_hit"]) == [line["cache_hit"] for line in lines]
    assert list(records["endpoint"]) == [line["endpoint"] for line in lines]
    assert list(records["deployment"]) == [line["deployment"] for line in lines]
    # the body keeps the client's field order (LiteLLM's key follows it)
    assert [json.loads(b) for b in records["request_body"]] == [line["request"] for line in lines]
    assert [list(json.loads(b)) for b in records["request_body"]] == [
        list(line["request"]) for line in lines
    ]
    # chat messages and embeddings inputs are no prompt prefix of the engine's
    assert records["prompt"].isna().all()
    own = own_mask(records)
    assert own.sum() == sum(line["request_id"].startswith("prewarm-") for line in lines) > 0
    chat = records[records["endpoint"] == "chat"]
    assert chat["temperature"].notna().all() and chat["max_tokens"].notna().all()


def test_bad_lines_are_rejects_naming_the_line_and_the_field(tmp_path):
    good = GOLDEN.read_text().splitlines()[0]
    line = json.loads(good)
    bad = [
        {**line, "ts": "yesterday"},
        {**line, "request": "not an object"},
        {**line, "endpoint": "images"},
        {**line, "cache_hit": "yes"},
        {key: v for key, v in line.items() if key != "request"},
    ]
    path = tmp_path / "litellm.jsonl"
    path.write_text("\n".join([good, *map(json.dumps, bad), "{cut off", good]) + "\n")
    result = ingest_paths([path], IngestOptions(format="litellm-jsonl"))
    summary = result.summary_dict()["files"][0]
    assert len(result.records) == 2 and sum(summary["rejected"].values()) == 6
    reasons = " | ".join(summary["rejected"])
    for field in ("'ts'", "'request'", "'endpoint'", "'cache_hit'"):
        assert field in reasons, reasons
    samples = [s for group in summary["reject_samples"].values() for s in group]
    assert {int(s.split(":")[1]) for s in samples} == {2, 3, 4, 5, 6, 7}


def test_the_gateways_candidates_are_what_clients_repeat_deterministically():
    records = ingest_paths([GOLDEN], IngestOptions()).records
    clients = records[~own_mask(records)]
    items = gateway_items(clients, "edge", min_count=2)
    shown = sorted((i.kind, json.dumps(i.request)) for i in items)
    lines = [line for line in _lines() if not line["request_id"].startswith("prewarm-")]
    chats = [line["request"] for line in lines if line["endpoint"] == "chat"]
    greedy_or_seeded = [b for b in chats if b.get("temperature") == 0 or "seed" in b]
    expected_chats = {json.dumps(b) for b in greedy_or_seeded if chats.count(b) >= 2}
    assert {s for k, s in shown if k == "response"} == expected_chats and expected_chats
    sampled = [b for b in chats if b.get("temperature") == 0.8]
    assert sampled and not any(json.loads(s) in sampled for _, s in shown)  # no single answer
    inputs = [t for line in lines if line["endpoint"] == "embeddings"
              for t in line["request"]["input"]]  # fmt: skip
    embedded = {json.loads(s)["input"][0] for k, s in shown if k == "embedding"}
    assert embedded == {t for t in inputs if inputs.count(t) >= 2} and embedded
    assert all(i.gateway == "edge" and i.request is not None for i in items)
    assert all(i.predicted_hits >= 2 for i in items)


def _config(tmp_path: Path, gateway: str) -> Path:
    path = tmp_path / "prewarm.toml"
    path.write_text('[[engines]]\nname = "e"\nurl = "http://e:8000"\nmodel = "m"\n\n'
                    '[[sources]]\nengine = "e"\nkind = "litellm"\npath = "/var/log/l.jsonl"\n\n'
                    + gateway)  # fmt: skip
    return path


@pytest.mark.parametrize(
    ("gateway", "message"),
    [
        ('[[gateways]]\nname = "g"\nurl = "http://g:4000"\nengine = "nope"\n', "gateways[0]"),
        ('[[gateways]]\nname = "g"\nurl = "g:4000"\nengine = "e"\n', "gateways.0.url"),
        (
            '[[gateways]]\nname = "g"\nurl = "http://g"\nengine = "e"\ncache_url = "http://r"\n',
            "gateways.0.cache_url",
        ),
        (
            '[[gateways]]\nname = "g"\nurl = "http://g"\nengine = "e"\nkind = "kong"\n',
            "gateways.0.kind",
        ),
        ('[[gateways]]\nname = "g"\nurl = "http://g"\nengine = "e"\n' * 2, "'g' is used twice"),
    ],
)
def test_a_bad_gateway_setting_is_reported_by_its_key(tmp_path, gateway, message):
    with pytest.raises(SettingsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_settings({}, _config(tmp_path, gateway))


def test_a_gateway_in_front_of_an_engine_and_its_log_as_a_source(tmp_path):
    settings = load_settings({}, _config(tmp_path, (
        '[[gateways]]\nname = "g"\nurl = "http://g:4000/"\nengine = "e"\nkey = "sk-1"\n'
        'cache_url = "redis://r:6379/1"\nnamespace = "gw"\nttl_s = 600\n'
    )))  # fmt: skip
    [gateway] = settings.gateways_of("e")
    assert gateway.url == "http://g:4000" and gateway.key.get_secret_value() == "sk-1"
    assert "sk-1" not in repr(gateway) and settings.sources_of("e")[0].kind == "litellm"


def test_the_callback_writes_one_line_a_request_without_metadata(tmp_path, monkeypatch):
    # The callback runs inside LiteLLM's proxy; here its base class is a stand-in.
    module = types.ModuleType("litellm.integrations.custom_logger")
    module.CustomLogger = type("CustomLogger", (), {})  # type: ignore[attr-defined]  # the stand-in
    monkeypatch.setitem(sys.modules, "litellm.integrations.custom_logger", module)
    monkeypatch.delitem(sys.modules, "jobs.litellm_log", raising=False)
    from jobs.litellm_log import PrewarmRequestLog, log_line

    body = {"model": "g", "messages": [{"role": "user", "content": "hi"}], "temperature": 0,
            "metadata": {"tags": ["x"]}, "litellm_call_id": "c1"}  # fmt: skip
    kwargs = {
        "litellm_params": {"proxy_server_request": {"body": body,
                                                    "headers": {"X-Request-Id": "prewarm-1"}}},
        "standard_logging_object": {"startTime": 1.8e9, "call_type": "acompletion",
                                    "model_group": "g", "model_id": "d1", "cache_hit": True,
                                    "cache_key": "gw:k", "prompt_tokens": 3, "id": "x"},
    }  # fmt: skip
    line = log_line(kwargs, "success")
    assert line["request"] == {"model": "g", "messages": body["messages"], "temperature": 0}
    assert (line["endpoint"], line["request_id"], line["deployment"]) == ("chat", "prewarm-1", "d1")
    writer = PrewarmRequestLog(tmp_path / "log.jsonl")
    writer._write(kwargs, "success")
    writer._write(kwargs, "failure")
    written = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [w["status"] for w in written] == ["success", "failure"]
    result = ingest_paths([tmp_path / "log.jsonl"], IngestOptions())
    assert len(result.records) == 2 and bool(result.records["cache_hit"].all())


def test_the_callback_needs_only_the_standard_library_and_pydantic(tmp_path):
    # The proxy's environment has LiteLLM, not prewarm's dependencies: importing the callback
    # must not load pandas, numpy, redis, httpx or Celery.
    script = """
import sys, types
blocked = {"pandas", "numpy", "redis", "httpx", "celery", "pyarrow"}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{name} imported")
sys.meta_path.insert(0, Block())
for name in ("litellm", "litellm.integrations", "litellm.integrations.custom_logger"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["litellm.integrations.custom_logger"].CustomLogger = object
import jobs.litellm_log
print("imported")
"""
    import subprocess

    env = {"PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO_ROOT, env=env, timeout=60)  # fmt: skip
    assert done.stdout.strip() == "imported", done.stderr[-2000:]


def test_litellm_is_an_extra_and_only_the_callback_imports_it():
    import re
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("litellm")]
    assert any(d.startswith("litellm") for d in project["optional-dependencies"]["litellm"])
    importing = sorted(
        str(path.relative_to(REPO_ROOT))
        for package in ("pipeline", "models", "tasks", "jobs")
        for path in (REPO_ROOT / package).rglob("*.py")
        if re.search(r"^\s*(from|import) litellm\b", path.read_text(), re.M)
    )
    assert importing == ["jobs/litellm_log.py"]
