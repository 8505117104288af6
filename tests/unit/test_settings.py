"""Settings validate at start and name the key that is wrong."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import SettingsError
from tasks.adapters.connections import redact_logged_urls, redacted
from tasks.settings import load_settings


def test_defaults_load_without_environment():
    settings = load_settings({})
    assert settings.redis_url.startswith("redis://")
    assert settings.store_redis_url == settings.redis_url


def test_bad_scalar_names_the_key():
    with pytest.raises(SettingsError, match="api_port"):
        load_settings({"PREWARM_API_PORT": "eighty"})


def test_missing_config_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(SettingsError, match=r"nope\.toml: config file not found"):
        load_settings({}, missing)


def test_malformed_config_file_names_the_path(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[budget\nmax_items = 3\n")
    with pytest.raises(SettingsError, match=r"bad\.toml: not valid TOML"):
        load_settings({}, path)


def test_engine_url_must_be_http(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[[engines]]\nname = "a"\nurl = "ftp://x"\nmodel = "m"\n')
    with pytest.raises(SettingsError, match=r"engines\.0\.url"):
        load_settings({}, path)


def test_unknown_engine_is_bad_input():
    settings = load_settings({})
    with pytest.raises(SettingsError, match="unknown engine 'x'"):
        settings.engine("x")


def test_environment_wins_over_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('redis_url = "redis://file:1/0"\n')
    settings = load_settings({"PREWARM_REDIS_URL": "redis://env:2/0"}, path)
    assert settings.redis_url == "redis://env:2/0"


@pytest.mark.parametrize("bad", ["\r", "\n", "\r\n", "\x00", "\t", "\x7f"])
def test_control_characters_in_an_engine_url_are_refused_naming_the_key(tmp_path, bad):
    path = tmp_path / "c.toml"
    url = f"http://127.0.0.1:8000/{bad}X-Injected: 1"
    path.write_text(f'[[engines]]\nname = "a"\nurl = {json.dumps(url)}\nmodel = "m"\n')
    with pytest.raises(SettingsError) as refused:
        load_settings({}, path)
    message = str(refused.value)
    assert "engines.0.url" in message and "control character" in message
    assert "\n" not in message and "\r" not in message


@pytest.mark.parametrize("key", ["PREWARM_REDIS_URL", "PREWARM_STORE_URL", "PREWARM_RESULT_URL"])
def test_control_characters_in_redis_urls_are_refused_naming_the_key(key):
    with pytest.raises(SettingsError, match=key.removeprefix("PREWARM_").lower()):
        load_settings({key: "redis://127.0.0.1:6379/0\r\nFLUSHALL"})


def test_control_characters_in_a_template_repo_url_are_refused(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        '[[template_repos]]\nname = "p"\nurl = "https://git.example/p\\n--upload-pack=x"\n'
    )
    with pytest.raises(SettingsError, match=r"template_repos\.0\.url"):
        load_settings({}, path)


def test_store_url_must_be_redis():
    with pytest.raises(SettingsError, match="store_url"):
        load_settings({"PREWARM_STORE_URL": "http://127.0.0.1:6379/1"})


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://alice:s3cret@vllm:8000/v1", "http://alice:***@vllm:8000/v1"),
        ("https://:s3cret@vllm", "https://:***@vllm"),
        ("https://tok3n@vllm", "https://***@vllm"),
        ("redis://default:s3cret@redis:6379/0", "redis://default:***@redis:6379/0"),
        ("http://a:s3cret@[::1]:8000", "http://a:***@[::1]:8000"),
        ("http://a:s3cret@host:notaport/x", "http://a:***@host:notaport/x"),
        ("http://a:s3c@ret@host/x", "http://a:***@host/x"),
        ("http://vllm:8000", "http://vllm:8000"),
    ],
)
def test_redacted_masks_the_password(url, shown):
    assert redacted(url) == shown
    assert "s3cret" not in redacted(url) and "tok3n" not in redacted(url)


def test_log_records_carry_urls_with_the_password_masked(caplog):
    import logging

    redact_logged_urls()
    redact_logged_urls()  # installed once
    with caplog.at_level(logging.INFO, logger="httpx"):
        logging.getLogger("httpx").info(
            'HTTP Request: %s %s "%s"', "GET", "http://ops:hunter2@vllm:8000/health", "200 OK"
        )
        logging.getLogger("tasks.x").warning(
            "retrying redis://:hunter2@redis:6379/0 and https://tok@h/"
        )
    text = caplog.text
    assert "hunter2" not in text and "tok@" not in text
    assert "http://ops:***@vllm:8000/health" in text and "redis://:***@redis:6379/0" in text
    assert "https://***@h/" in text


KV_ENGINE = '[[engines]]\nname = "a"\nurl = "http://127.0.0.1:1"\nmodel = "m"\n'
KV_SOURCE = '[[sources]]\nengine = "a"\nkind = "kv-events"\n'


def _kv_settings(tmp_path, source: str):
    path = tmp_path / "kv.toml"
    path.write_text(KV_ENGINE + '[[sources]]\nengine = "a"\nkind = "vllm-log"\npath = "x.log"\n'
                    + source)  # fmt: skip
    return load_settings({}, path)


def test_a_kv_events_source_is_the_engines_event_stream_not_a_file_to_read(tmp_path):
    source = KV_SOURCE + 'endpoint = "tcp://vllm:5557"\nreplay_endpoint = "tcp://vllm:5558"\n'
    settings = _kv_settings(tmp_path, source + 'topic = "kv"\n')
    kv = settings.kv_events_of("a")
    assert kv is not None and kv.kind == "kv-events" and kv.topic == "kv"
    assert (kv.endpoint, kv.replay_endpoint) == ("tcp://vllm:5557", "tcp://vllm:5558")
    assert [s.kind for s in settings.sources_of("a")] == ["vllm-log"]  # what the loop reads
    assert _kv_settings(tmp_path, "").kv_events_of("a") is None


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ('endpoint = "http://vllm:5557"\n', r"'sources\.1\.endpoint': .*must be a ZMQ endpoint"),
        ('endpoint = "tcp://vllm"\n', r"'sources\.1\.endpoint': .*needs the host and port"),
        ('endpoint = "tcp://*:5557"\n', r"'sources\.1\.endpoint': .*needs the host and port"),
        ('endpoint = "tcp://vllm:5557"\nreplay_endpoint = "vllm:5558"\n',
         r"'sources\.1\.replay_endpoint': .*must be a ZMQ endpoint"),
        ("", r"'sources\.1\.endpoint': Field required"),
        ('endpoint = "tcp://vllm:5557"\npath = "x.log"\n', r"'sources\.1\.path': Extra inputs"),
        ('endpoint = "tcp://vllm:5557"\ntopic = 7\n', r"'sources\.1\.topic'"),
    ],
)  # fmt: skip
def test_a_bad_kv_events_source_names_its_field(tmp_path, lines, message):
    with pytest.raises(SettingsError, match=message):
        _kv_settings(tmp_path, KV_SOURCE + lines)


def test_one_kv_events_source_per_engine(tmp_path):
    one = KV_SOURCE + 'endpoint = "tcp://vllm:5557"\n'
    with pytest.raises(SettingsError, match="more than one kv-events source for engine 'a'"):
        _kv_settings(tmp_path, one + one)


def test_the_kv_events_service_takes_its_endpoints_from_the_settings(tmp_path):
    from jobs.cmd_kv_events import kv_source
    from pipeline.errors import BadInputError

    source = KV_SOURCE + 'endpoint = "tcp://vllm:5557"\nreplay_endpoint = "tcp://vllm:5558"\n'
    settings = _kv_settings(tmp_path, source)
    kv = kv_source(settings, "a", None, None, None)
    assert (kv.endpoint, kv.replay_endpoint, kv.topic) == ("tcp://vllm:5557", "tcp://vllm:5558", "")
    given = kv_source(settings, "a", "tcp://other:1", None, "t")  # options win, not mixed
    assert (given.endpoint, given.replay_endpoint, given.topic) == ("tcp://other:1", None, "t")
    with pytest.raises(BadInputError, match='engine = "b", kind = "kv-events"'):
        kv_source(settings, "b", None, None, None)
    with pytest.raises(BadInputError, match="must be a ZMQ endpoint") as error:
        kv_source(settings, "a", "vllm:5557", None, None)
    assert error.value.where == "--endpoint"
