"""Template reading, fingerprints, static prefixes and the sandbox (pure)."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import BadInputError
from pipeline.templates import (
    check_symlink,
    jinja_template,
    render,
    repo_relative_path,
    templates_in_file,
)


def _one(source: str):
    return jinja_template("t.jinja", "t.jinja", "jinja", source)


def test_text_edit_keeps_structure_changes_content():
    a = _one("You are a helpful bot.\n{% for m in messages %}{{ m.content|trim }}{% endfor %}")
    b = _one("You are a careful bot.\n{% for m in messages %}{{ m.content|trim }}{% endfor %}")
    assert a.structure == b.structure
    assert a.content != b.content


@pytest.mark.parametrize(
    "edited",
    [
        "You are a helpful bot.\n{% for m in messages %}{{ m.text|trim }}{% endfor %}",
        "You are a helpful bot.\n{% for m in messages %}{{ m.content|upper }}{% endfor %}",
        "You are a helpful bot.\n{% for m in messages %}{{ m.content|trim }}{{ x }}{% endfor %}",
        "You are a helpful bot.\n{% block b %}{% for m in messages %}{{ m.content|trim }}"
        "{% endfor %}{% endblock %}",
    ],
)
def test_structural_edits_change_structure(edited):
    base = _one("You are a helpful bot.\n{% for m in messages %}{{ m.content|trim }}{% endfor %}")
    assert _one(edited).structure != base.structure


def test_static_prefix_stops_at_first_variable_or_tag_and_skips_comments():
    assert _one("System: be brief. {# note #}Answer: {{ q }} done").static_prefix == (
        "System: be brief. Answer: "
    )
    assert _one("Head {%- if x %}y{% endif %}").static_prefix == "Head"
    assert _one("{{ bos_token }}Hello").static_prefix == ""
    assert _one("all literal").static_prefix == "all literal"


def test_chat_templates_string_and_named_list():
    single = json.dumps({"chat_template": "<s>{% for m in messages %}{{ m.content }}{% endfor %}"})
    (only,) = templates_in_file("m/tokenizer_config.json", single.encode())
    assert only.template_id == "m/tokenizer_config.json#default"
    assert only.kind == "chat" and only.static_prefix == "<s>"
    named = json.dumps(
        {
            "chat_template": [
                {"name": "default", "template": "A{{ x }}"},
                {"name": "tool_use", "template": "B{{ y }}"},
            ]
        }
    )
    ids = [t.template_id for t in templates_in_file("tokenizer_config.json", named.encode())]
    assert ids == ["tokenizer_config.json#default", "tokenizer_config.json#tool_use"]
    assert templates_in_file("tokenizer_config.json", b'{"model_max_length": 5}') == []


def test_chat_template_file_kind():
    (t,) = templates_in_file(
        "chat_template.jinja", b"{{ bos_token }}{% for m in messages %}{% endfor %}"
    )
    assert t.kind == "chat"


def test_python_module_read_with_ast_never_run(tmp_path):
    marker = tmp_path / "ran"
    source = (
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n"
        "SYSTEM = 'You are a terse assistant.'\n"
        "QA: str = 'Question: {question}\\nAnswer:'\n"
        "def f(name):\n    return f'Hi {name}'\n"
        "GREETING = f'Hello there, {user.name!r:>10}'\n"
        "JINJA = 'Docs:\\n{% for d in docs %}{{ d }}{% endfor %}'\n"
        "__all__ = ['SYSTEM']\nCOUNT = 3\n"
    )
    found = {
        t.template_id.split("#")[1]: t for t in templates_in_file("p/prompts.py", source.encode())
    }
    assert not marker.exists()
    assert sorted(found) == ["GREETING", "JINJA", "QA", "SYSTEM"]
    assert found["QA"].static_prefix == "Question: "
    assert found["GREETING"].static_prefix == "Hello there, "
    assert found["JINJA"].static_prefix == "Docs:\n"
    assert found["SYSTEM"].static_prefix == "You are a terse assistant."


def test_python_fstring_text_vs_structure():
    a = templates_in_file("p.py", b"P = f'Hello {user} how are you'\n")[0]
    b = templates_in_file("p.py", b"P = f'Howdy {user} how are you'\n")[0]
    c = templates_in_file("p.py", b"P = f'Hello {person} how are you'\n")[0]
    assert a.structure == b.structure and a.content != b.content
    assert a.structure != c.structure


@pytest.mark.parametrize(
    "escape",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os }}",
        "{{ self._TemplateReference__context }}",
        "{{ lipsum.__globals__['os'] }}",
        "{{ x['__class__'] }}",
        "{{ x|attr('__class__') }}",
        "{{ x|attr('__cla' ~ 'ss__') }}",
        "Hi {% for c in ''.__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
    ],
)
def test_sandbox_escapes_are_refused(escape):
    with pytest.raises(BadInputError, match="sandbox escape refused") as info:
        _one(escape)
    assert "t.jinja:1" in str(info.value)


def test_sandbox_escape_in_chat_template_and_python_module_refused():
    config = json.dumps({"chat_template": "{{ ''.__class__.__mro__ }}"}).encode()
    with pytest.raises(BadInputError, match="sandbox escape"):
        templates_in_file("tokenizer_config.json", config)
    with pytest.raises(BadInputError, match="private attribute"):
        templates_in_file("p.py", b"P = 'x {0.__class__.__mro__}'\n")


def test_render_is_sandboxed():
    t = _one("Hello {{ name }}!")
    assert render(t, {"name": "Ada"}) == "Hello Ada!"
    # A call the immutable sandbox forbids at run time (mutating a list) is refused too.
    mutating = _one("{{ items.append(1) }}")
    with pytest.raises(BadInputError, match="sandbox refused"):
        render(mutating, {"items": []})


@pytest.mark.parametrize("bad", ["../outside.jinja", "/etc/passwd", "a/../../b.j2", "..", ""])
def test_paths_leaving_the_repository_are_refused(bad):
    with pytest.raises(BadInputError, match="leaves the repository"):
        repo_relative_path(bad)


def test_symlink_targets():
    assert check_symlink("a/b/link.jinja", "../c.jinja") == "a/c.jinja"
    for target in ("../../../etc/passwd", "/etc/passwd"):
        with pytest.raises(BadInputError, match="outside the repository"):
            check_symlink("a/link.jinja", target)


def test_bad_files_name_file_and_line():
    with pytest.raises(BadInputError, match=r"t.jinja:2"):
        templates_in_file("t.jinja", b"ok\n{% if %}")
    with pytest.raises(BadInputError, match=r"p.py:1"):
        templates_in_file("p.py", b"P = (\n")
    with pytest.raises(BadInputError, match="not valid JSON"):
        templates_in_file("tokenizer_config.json", b"{")
    with pytest.raises(BadInputError, match="not UTF-8"):
        templates_in_file("t.j2", b"\xff\xfe")
