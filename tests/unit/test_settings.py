"""Settings validate at start and name the key that is wrong."""

from __future__ import annotations

import pytest

from pipeline.errors import SettingsError
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
