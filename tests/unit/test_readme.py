"""The README is a page whose commands are CI's; the reference in docs/ documents every setting."""

from __future__ import annotations

import re

from tasks import settings as settings_module
from tests.conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
CONFIGURATION = (REPO_ROOT / "docs" / "pages" / "configuration.md").read_text()
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
    # the tests bring the Debian programs they drive, so CI installs nothing the README does not
    assert "apt-get" not in ci


def test_ci_builds_the_docs_strictly():
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert re.search(r"^mkdocs build --strict -f docs/mkdocs\.yml", ci, re.MULTILINE)


def test_the_readme_stays_a_page():
    assert len(README.splitlines()) <= 150


def test_every_relative_link_of_the_readme_points_at_a_file():
    targets = re.findall(r"\]\(([^)\s]+)\)", README)
    relative = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:|#", t)]
    assert relative, "the README links into docs/"
    missing = [target for target in relative if not (REPO_ROOT / target).exists()]
    assert not missing


def test_every_setting_and_its_environment_name_is_documented():
    doc = CONFIGURATION
    for key in settings_module._ENV_KEYS:
        assert f"`{key}`" in doc and f"`PREWARM_{key.upper()}`" in doc, key
    for field in settings_module.Settings.model_fields:
        assert f"`{field}`" in doc or f"[{field}]" in doc or f"[[{field}]]" in doc, field


def test_every_field_of_every_settings_section_is_documented():
    sections = (
        settings_module.EngineSettings, settings_module.TemplateRepoSettings,
        settings_module.BudgetSettings, settings_module.ScheduleSettings,
        settings_module.TenantSettings, settings_module.SourceSettings,
        settings_module.KvEventSourceSettings, settings_module.LoopSettings,
        settings_module.GatewaySettings,
        settings_module.TopicSettings,
    )  # fmt: skip
    for section in sections:
        for field in section.model_fields:
            assert f"`{field}`" in CONFIGURATION, f"{section.__name__}.{field}"


def test_the_example_config_file_loads():
    from tasks.settings import load_settings

    settings = load_settings({}, REPO_ROOT / "config" / "prewarm.example.toml")
    assert settings.engine("simulator").kind == "simulator"
    kv = settings.kv_events_of("simulator")  # what compose's kv-events service follows
    assert kv is not None and kv.endpoint == "tcp://simulator:5557"
