"""Settings validate at start and name the key that is wrong."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import SettingsError
from tasks.connections import redact_logged_urls, redacted
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
