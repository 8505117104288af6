"""The shared store on a folder and in memory: whole-or-absent writes, names, counts, and the
model shelf's publish/fetch round trip (the S3 endpoint's own tests are in
``tests/integration/test_object_store.py``)."""

from __future__ import annotations

import pandas as pd
import pytest

from tasks.adapters.model_shelf import fetch, publish
from tasks.adapters.shared_store import SharedStore, shared_store


@pytest.fixture(params=["folder", "memory"])
def store(request, tmp_path) -> SharedStore:
    if request.param == "folder":
        return SharedStore(str(tmp_path / "data"))
    return SharedStore(f"memory://prewarm-test/{tmp_path.name}")


def test_a_write_is_read_back_whole_and_counted(store):
    store.write_json("observations/e/manifest.json", {"version": 3})
    store.write_parquet("observations/e/counts.parquet", pd.DataFrame({"a": [1, 2]}))
    assert store.read_json("observations/e/manifest.json") == {"version": 3}
    assert list(store.read_parquet("observations/e/counts.parquet", "counts")["a"]) == [1, 2]
    assert store.read_bytes("observations/e/absent") is None
    assert store.names("observations/e") == ["counts.parquet", "manifest.json"]
    assert store.walk("observations") == [
        "observations/e/counts.parquet", "observations/e/manifest.json"
    ]  # fmt: skip
    counts = store.counts.snapshot()
    assert counts["requests"]["put"] == 2 and counts["requests"]["get"] >= 3
    assert counts["bytes_written"] > 0 and counts["bytes_read"] > 0


def test_a_folder_write_leaves_no_temporary_file_and_create_refuses_a_second(tmp_path):
    store = shared_store(tmp_path / "data")
    store.write_bytes("kv/e/holdings.msgpack", b"1")
    store.write_bytes("kv/e/holdings.msgpack", b"22")
    assert sorted(p.name for p in (tmp_path / "data" / "kv" / "e").iterdir()) == [
        "holdings.msgpack"
    ]
    store.create_bytes("models/m/v0001/.claim", b"")
    with pytest.raises(FileExistsError):
        store.create_bytes("models/m/v0001/.claim", b"")


def test_a_published_version_is_fetched_by_another_host(tmp_path):
    store = SharedStore(f"memory://prewarm-shelf/{tmp_path.name}")
    mine = tmp_path / "host-a"
    (mine / "hotness" / "v0001").mkdir(parents=True)
    (mine / "hotness" / "v0001" / "metadata.json").write_text("{}")
    (mine / "hotness" / "current").write_text("v0001")
    publish(store, "models/e", mine, {})
    other = tmp_path / "host-b"
    other.mkdir()
    assert fetch(store, "models/e", other) == {"hotness": "v0001"}
    assert (other / "hotness" / "v0001" / "metadata.json").read_text() == "{}"
