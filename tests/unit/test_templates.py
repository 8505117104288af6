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


# --- limits: nothing a template does can crash, hang or exhaust a worker ----------------------

DEEP_IF = "{% if x %}" * 20_000 + "deep" + "{% endif %}" * 20_000
DEEP_PARENS = "{{ " + "(" * 100_000 + "1" + ")" * 100_000 + " }}"


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        (DEEP_IF, "nested deeper"),
        (DEEP_PARENS, "nested deeper"),
        ("{{ " + "[" * 5_000 + "]" * 5_000 + " }}", "nested deeper"),
        ("{{ " + "not " * 5_000 + "x }}", "nested too deeply"),
        ("{{ x" + "|e" * 500 + " }}", "nested deeper"),
        ("{{ x }}" * 60_000, "tokens"),
    ],
    ids=["if-20k", "parens-100k", "lists-5k", "not-5k", "filters-500", "tokens"],
)
def test_deeply_nested_templates_are_bad_input_naming_file_and_line(source, reason):
    with pytest.raises(BadInputError, match=reason) as refused:
        templates_in_file("prompts/deep.jinja", source.encode())
    assert refused.value.where.startswith("prompts/deep.jinja:")
    assert refused.value.where.rsplit(":", 1)[1].isdigit()


def test_nesting_is_reported_at_its_line():
    source = "ok\n" * 7 + "{% if a %}" * 40 + "x" + "{% endif %}" * 40
    with pytest.raises(BadInputError) as refused:
        _one(source)
    assert refused.value.where == "t.jinja:8"


def test_a_template_over_the_size_cap_is_refused_before_parsing():
    huge = b"{{ x }}" + b"a" * (50 * 1024 * 1024)
    with pytest.raises(BadInputError, match="size limit") as refused:
        templates_in_file("prompts/huge.jinja", huge)
    assert refused.value.where == "prompts/huge.jinja:1"


def test_deeply_nested_tokenizer_config_is_bad_input():
    deep = '{"chat_template": "hi", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(BadInputError, match="nested deeper") as refused:
        templates_in_file("m/tokenizer_config.json", deep.encode())
    assert refused.value.where == "m/tokenizer_config.json:1"


def test_deeply_nested_python_module_is_bad_input():
    deep = "X = " + "(" * 100_000 + "1" + ")" * 100_000 + "\n"
    with pytest.raises(BadInputError, match=r"app/deep\.py"):
        templates_in_file("app/deep.py", deep.encode())


def _render(source: str, context=None, files=None, **options):
    return render(_one(source), context or {}, files, **options)


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("{{ 9**(9**(9**9)) }}", "power"),
        ("{{ 2 ** 100000 }}", "power"),
        ("{{ 1.5 ** 100000 }}", "power"),
        ("{% for i in range(100000) %}{% for j in range(10) %}{% endfor %}{% endfor %}", "range"),
        ("{{ 'x' * 10**9 }}", "repetition"),
        ("{{ [0] * 10**9 }}", "repetition"),
        ("{{ 'x'.center(10**9) }}", "width"),
        ("{{ 'x'|center(10**9) }}", "width"),
        ("{{ '%999999999d' % 1 }}", "format width"),
        ("{{ '{:>999999999}'.format(1) }}", "format width"),
        ("{{ ('x' * 100000)|replace('x', 'x' * 1000) }}", "replace"),
        ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
         "{% endfor %}", "over"),
        ("{% macro m() %}{% for i in range(10000) %}{{ 'y' * 100000 }}{% endfor %}{% endmacro %}"
         "{{ m() }}", "output"),
        ("{% for i in range(10000) %}{{ 'y' * 1000 }}{% endfor %}", "output"),
        ("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}", "recursion"),
        ("{{ 1 / 0 }}", "division"),
        ("{{ 'a' + 1 }}", "concatenate"),
        ("{{ [1]|slice(10**8)|list }}", "width"),
    ],
)  # fmt: skip
def test_render_budgets_are_bad_input(source, reason):
    with pytest.raises(BadInputError, match=reason) as refused:
        _render(source)
    assert refused.value.where.startswith("t.jinja:")


def test_render_time_is_bounded_by_the_clock():
    ticks = iter(range(10**9))
    # Each reading of this clock is one second later: the render stops at its 2 s deadline.
    with pytest.raises(BadInputError, match="over 2s"):
        _render("{% for i in range(50) %}{{ i }}{% endfor %}", clock=lambda: float(next(ticks)))


def test_nested_loops_over_strings_stop_at_the_step_budget():
    source = "{% for a in 'x' * 100000 %}{% for b in 'y' * 100000 %}{% endfor %}{% endfor %}"
    with pytest.raises(BadInputError, match=r"steps|over"):
        _render(source)


def test_errors_name_the_line():
    with pytest.raises(BadInputError) as refused:
        _render("first\nsecond\n{{ 1 // 0 }}")
    assert refused.value.where == "t.jinja:3"


@pytest.mark.parametrize(
    "source",
    [
        "{% include '../secrets.j2' %}",
        "{% include '/etc/passwd' %}",
        "{% include ['ok.j2', '../../etc/passwd'] %}",
        "{% import '../macros.j2' as m %}",
        "{% from '/abs/macros.j2' import x %}",
        "{% extends '../../base.j2' %}",
    ],
)
def test_references_leaving_the_repository_are_refused_at_parse_time(source):
    with pytest.raises(BadInputError, match="refused") as refused:
        _one(source)
    assert refused.value.where == "t.jinja:1"


def test_includes_resolve_only_inside_the_repository():
    files = {"parts/head.j2": "Head {{ name }}.", "base.j2": "<{% block b %}{% endblock %}>"}
    assert _render("{% include 'parts/head.j2' %}!", {"name": "N"}, files) == "Head N.!"
    assert _render("{% extends 'base.j2' %}{% block b %}x{% endblock %}", {}, files) == "<x>"
    with pytest.raises(BadInputError, match="leaves the repository") as refused:
        _render("{% include name %}", {"name": "/etc/passwd"}, files)
    assert refused.value.where == "t.jinja:1"
    with pytest.raises(BadInputError, match="leaves the repository"):
        _render("{% include name %}", {"name": "../../etc/passwd"}, files)
    with pytest.raises(BadInputError, match="no template"):
        _render("{% include 'parts/head.j2' %}")  # no files given: nothing to include


def test_an_included_template_is_checked_too():
    files = {"deep.j2": DEEP_IF, "self.j2": "{% include 'self.j2' %}"}
    with pytest.raises(BadInputError, match="nested deeper"):
        _render("{% include 'deep.j2' %}", {}, files)
    with pytest.raises(BadInputError, match="recursion"):
        _render("{% include 'self.j2' %}", {}, files)


def test_ordinary_templates_render_within_the_budgets():
    source = (
        "System.\n{% for m in messages %}<|{{ m.role }}|>{{ m.content|trim }}\n{% endfor %}"
        "{{ '%5.2f' % 3.14159 }} {{ '{:>8}'.format('x') }} {{ 2 ** 10 }} {{ 'ab' * 3 }}"
        "{% set ns = namespace(n=0) %}{% for i in range(100) %}{% set ns.n = ns.n + i %}"
        "{% endfor %}{{ ns.n }} {{ 123456789|string }} {{ 'a-b'|replace('-', '+') }}"
    )
    messages = [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]
    out = _render(source, {"messages": messages})
    assert (
        out == "System.\n<|user|>hi\n<|assistant|>yo\n 3.14        x 1024 ababab4950 123456789 a+b"
    )
