"""``[[fleets]]``: a router and its replicas; each replica an engine with its own URL, metrics,
log and KV-event stream; bad entries name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import SettingsError
from pipeline.fleet_roads import Road, road_note, road_of
from tasks.settings import KvEventSourceSettings, SourceSettings, load_settings

LISTED = """
[[fleets]]
name = "chat"
router_url = "http://router:30000/"
policy = "cache_aware"
model = "llama"
cache_tokens = 8192
cache_block_tokens = 16
log = "/var/log/vllm/{name}.log"
kv_events = "tcp://{host}:5557"
kv_replay = "tcp://{host}:5558"

[[fleets.replicas]]
url = "http://vllm-0:8000"

[[fleets.replicas]]
url = "http://vllm-1:8000"
name = "b"
metrics_url = "http://vllm-1:9090/metrics"
kv_events = "tcp://other:6000"
cache_tokens = 4096
"""

ROUTED = """
[[fleets]]
name = "rr"
router_url = "http://router2:30000"
policy = "round_robin"
model = "llama"
replicas_from = "router"
log = "/logs/{host}-{port}.log"
"""


FOUND_BY_DNS = """
[[fleets]]
name = "k8s"
router_url = "http://router3:30000"
policy = "kv_aware"
model = "llama"
replicas_from = "dns"
replicas_dns = "vllm-headless.llm.svc.cluster.local:8000"
kv_events = "tcp://{host}:5557"
"""


def _load(tmp_path: Path, text: str):
    path = tmp_path / "prewarm.toml"
    path.write_text(text)
    return load_settings({}, path)


def test_listed_replicas_are_engines_with_their_own_sources(tmp_path):
    settings = _load(tmp_path, LISTED + '[[sources]]\nengine = "b"\nkind = "jsonl"\npath = "/x"\n')
    first, second = settings.replicas_of("chat")
    assert (first.name, first.url, first.cache_tokens) == ("chat-vllm-0-8000", "http://vllm-0:8000",
                                                           8192)  # fmt: skip
    assert (second.name, second.cache_tokens, second.metrics_url) == (
        "b",
        4096,
        "http://vllm-1:9090/metrics",
    )
    assert first.fleet == second.fleet == "chat" and first.cache_block_tokens == 16
    assert [s.path for s in settings.sources_of("b")] == ["/x", "/var/log/vllm/b.log"]
    assert settings.sources_of("chat-vllm-0-8000")[0].path == "/var/log/vllm/chat-vllm-0-8000.log"
    kv = settings.kv_events_of("chat-vllm-0-8000")
    assert kv is not None and (kv.endpoint, kv.replay_endpoint) == (
        "tcp://vllm-0:5557",
        "tcp://vllm-0:5558",
    )
    other = settings.kv_events_of("b")
    assert other is not None and other.endpoint == "tcp://other:6000"
    assert settings.fleet("chat").router_url == "http://router:30000"


def test_router_listed_replicas_come_and_go_with_the_worker_list(tmp_path):
    settings = _load(tmp_path, ROUTED)
    assert settings.replicas_of("rr") == ()
    two = settings.with_members({"rr": ["http://10.0.0.5:8000", "http://10.0.0.6:8000"]})
    assert [e.name for e in two.replicas_of("rr")] == ["rr-10.0.0.5-8000", "rr-10.0.0.6-8000"]
    assert [s.path for s in two.sources_of("rr-10.0.0.6-8000")] == ["/logs/10.0.0.6-8000.log"]
    one = two.with_members({"rr": ["http://10.0.0.6:8000"]})  # (from any settings: no doubles)
    assert [e.name for e in one.engines] == ["rr-10.0.0.6-8000"]
    assert [s.engine for s in one.sources if isinstance(s, SourceSettings)] == ["rr-10.0.0.6-8000"]
    assert not any(isinstance(s, KvEventSourceSettings) for s in one.sources)


def test_replicas_found_by_dns_are_the_addresses_the_name_resolves_to(tmp_path):
    settings = _load(tmp_path, FOUND_BY_DNS)
    assert settings.replicas_of("k8s") == ()  # none until a look resolves the name
    pods = ["http://10.1.0.7:8000", "http://[fd00::9]:8000"]
    current = settings.with_members({"k8s": pods})
    assert [e.name for e in current.replicas_of("k8s")] == ["k8s-10.1.0.7-8000", "k8s-fd00-9-8000"]
    kv = current.kv_events_of("k8s-10.1.0.7-8000")
    assert kv is not None and kv.endpoint == "tcp://10.1.0.7:5557"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (LISTED.replace("http://vllm-1:8000", "ftp://vllm-1"), r"fleets\.0\.replicas\.1\.url"),
        (LISTED.replace('policy = "cache_aware"', 'policy = "nearest"'), r"fleets\.0\.policy"),
        (LISTED.replace("{name}.log", "{pod}.log"), r"fleets\.0\.log.*\{pod\}"),
        (LISTED.replace("tcp://other:6000", "tcp://*:6000"), r"fleets\.0\.replicas\.1\.kv_events"),
        (ROUTED.replace('replicas_from = "router"', ""), r"fleets\.0.*lists no replicas"),
        (LISTED + '[[engines]]\nname = "b"\nurl = "http://b:1"\nmodel = "m"\n',
         r"replica 'b' is also an engine"),
        (LISTED + ROUTED.replace('"rr"', '"chat"'), r"fleets\[1\]: name 'chat' is taken"),
        (LISTED + '[[sources]]\nengine = "c"\nkind = "jsonl"\npath = "/x"\n',
         r"sources\[0\]: engine 'c' is not configured"),
        (FOUND_BY_DNS.replace(":8000", ""), r"fleets\.0\.replicas_dns.*not host:port"),
        (FOUND_BY_DNS.replace(":8000", ":80000"), r"fleets\.0\.replicas_dns.*not host:port"),
        (FOUND_BY_DNS.replace('replicas_from = "dns"', ""), r"lists no replicas.*or \"dns\""),
        (ROUTED.replace('"router"', '"dns"'), r"replicas_dns goes with"),
        (FOUND_BY_DNS.replace('model =', 'router = "sglang-router"\nmodel ='),
         r"fleets\.0.*policy: sglang-router 0\.3\.2 has no policy 'kv_aware'"),
        (ROUTED.replace('policy = "round_robin"', 'router = "nginx"'), r"fleets\.0\.router"),
    ],
)  # fmt: skip
def test_a_bad_fleet_names_the_field(tmp_path, text, where):
    with pytest.raises(SettingsError, match=where):
        _load(tmp_path, text)


def test_each_policy_family_has_its_road():
    assert road_of("cache_aware") is Road.THROUGH_ROUTER
    assert road_of("kv_aware") is Road.ON_REPLICA
    spread = ("round_robin", "power_of_two", "random", "consistent_hash", "sticky_least_loaded")
    assert {road_of(p) for p in spread} == {Road.EVERY_REPLICA}
    assert "through the router" in road_note("cache_aware")
    assert "every replica" in road_note("consistent_hash")
