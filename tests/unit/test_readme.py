"""The README says what the code does: its commands are CI's, its settings table is complete."""

from __future__ import annotations

import re

from tasks import settings as settings_module
from tests.conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
INSTALL = 'pip install torch==2.13.0 && pip install -e ".[models,dev,ops]"'


def _code_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, re.DOTALL)


def test_the_two_fresh_machine_commands_are_install_then_demo_or_tests():
    blocks = [block.strip().splitlines() for block in _code_blocks()]
    assert [INSTALL, "prewarm demo"] in blocks
    assert [INSTALL, "python -m pytest -q"] in blocks


def test_ci_runs_the_readmes_test_command():
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert re.search(r"^python -m pytest -q$", ci, re.MULTILINE)
    assert "torch==2.13.0" in ci


def test_every_setting_and_its_environment_name_is_documented():
    for key in settings_module._ENV_KEYS:
        assert f"`{key}`" in README and f"`PREWARM_{key.upper()}`" in README, key
    for field in settings_module.Settings.model_fields:
        assert f"`{field}`" in README or f"[{field}]" in README or f"[[{field}]]" in README, field


def test_every_field_of_every_settings_section_is_documented():
    sections = (
        settings_module.EngineSettings, settings_module.TemplateRepoSettings,
        settings_module.BudgetSettings, settings_module.ScheduleSettings,
        settings_module.TenantSettings, settings_module.SourceSettings,
        settings_module.KvEventSourceSettings, settings_module.LoopSettings,
    )  # fmt: skip
    for section in sections:
        for field in section.model_fields:
            assert f"`{field}`" in README, f"{section.__name__}.{field}"


def test_the_example_config_file_loads():
    from tasks.settings import load_settings

    settings = load_settings({}, REPO_ROOT / "config" / "prewarm.example.toml")
    assert settings.engine("simulator").kind == "simulator"
    kv = settings.kv_events_of("simulator")  # what compose's kv-events service follows
    assert kv is not None and kv.endpoint == "tcp://simulator:5557"
