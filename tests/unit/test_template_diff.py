"""Classification, the re-warm set, file patterns and templates meeting traffic (pure)."""

from __future__ import annotations

import pytest

from pipeline.errors import BadInputError
from pipeline.template_diff import (
    ChangeKind,
    PrefixMatcher,
    check_patterns,
    classify,
    matches,
    rewarm_items,
    rewarm_set,
    template_hotness,
    version_tag,
)
from pipeline.templates import jinja_template


def _t(template_id: str, source: str):
    return jinja_template(template_id, template_id.split("#")[0], "jinja", source)


def test_classify_every_kind():
    old = {
        "a.jinja": _t("a.jinja", "Alpha head text {{ x }}"),
        "b.jinja": _t("b.jinja", "Beta head text {{ x }}"),
        "c.jinja": _t("c.jinja", "Gamma {{ x }}"),
        "d.jinja": _t("d.jinja", "Delta {{ x }}"),
        "same.jinja": _t("same.jinja", "Same {{ x }}"),
    }
    new = {
        "a.jinja": _t("a.jinja", "Alpha HEAD text {{ x }}"),
        "b.jinja": _t("b.jinja", "Beta head text {{ x|upper }}"),
        "e.jinja": _t("e.jinja", "Gamma {{ x }}"),
        "f.jinja": _t("f.jinja", "New {{ y }}"),
        "same.jinja": _t("same.jinja", "Same {{ x }}"),
    }
    changes = {c.template_id: c for c in classify(old, new, {"c.jinja": "e.jinja"})}
    assert {k: c.kind for k, c in changes.items()} == {
        "a.jinja": ChangeKind.TEXT_ONLY, "b.jinja": ChangeKind.STRUCTURAL,
        "e.jinja": ChangeKind.RENAMED, "d.jinja": ChangeKind.REMOVED, "f.jinja": ChangeKind.ADDED,
    }  # fmt: skip
    plan = rewarm_set(list(changes.values()))
    assert sorted(t.template_id for t in plan.warm) == ["a.jinja", "b.jinja", "e.jinja", "f.jinja"]
    assert sorted(t.template_id for t in plan.retire) == [
        "a.jinja",
        "b.jinja",
        "c.jinja",
        "d.jinja",
    ]


def test_named_templates_follow_their_file_rename():
    old = {"m/tokenizer_config.json#default": _t("m/tokenizer_config.json#default", "<s>{{ x }}")}
    new = {"n/tokenizer_config.json#default": _t("n/tokenizer_config.json#default", "<s>{{ x }}")}
    (change,) = classify(old, new, {"m/tokenizer_config.json": "n/tokenizer_config.json"})
    assert change.kind == ChangeKind.RENAMED


def test_rewarm_is_ordered_by_hotness_including_traffic_seen_under_the_old_id():
    old = {
        "cold.jinja": _t("cold.jinja", "Cold {{ x }}"),
        "hot.jinja": _t("hot.jinja", "Hot {{ x }}"),
    }
    new = {
        "cold.jinja": _t("cold.jinja", "Cold! {{ x }}"),
        "hot2.jinja": _t("hot2.jinja", "Hot! {{ x }}"),
    }
    changes = classify(old, new, {"hot.jinja": "hot2.jinja"})
    plan = rewarm_set(changes, {"hot.jinja": 50, "cold.jinja": 3})
    assert [t.template_id for t in plan.warm] == ["hot2.jinja", "cold.jinja"]


def test_patterns():
    patterns = ("**/*.jinja", "prompts/*.py", "**/tokenizer_config.json")
    assert matches("a.jinja", patterns) and matches("x/y/a.jinja", patterns)
    assert matches("prompts/p.py", patterns) and not matches("prompts/sub/p.py", patterns)
    assert matches("tokenizer_config.json", patterns) and not matches("a.jinja2", patterns)
    with pytest.raises(BadInputError):
        check_patterns(["/etc/*.jinja"])


def test_prompts_match_the_longest_static_prefix():
    templates = [
        _t("general.jinja", "You are a helpful assistant. {{ q }}"),
        _t("billing.jinja", "You are a helpful assistant. Billing desk: {{ q }}"),
        _t("short.jinja", "Hi {{ q }}"),  # too short a head to attribute traffic by
    ]
    matcher = PrefixMatcher(templates)
    assert matcher.match("You are a helpful assistant. Billing desk: refund?") == "billing.jinja"
    assert matcher.match("You are a helpful assistant. What time is it?") == "general.jinja"
    assert matcher.match("Hi there") is None
    prompts = [
        "You are a helpful assistant. Billing desk: a",
        "You are a helpful assistant. Billing desk: b",
        "You are a helpful assistant. c",
        None,
        float("nan"),
        "unrelated",
    ]
    assert template_hotness(prompts, templates) == {"billing.jinja": 2, "general.jinja": 1}


def test_rewarm_items_carry_the_version_in_key_and_skip_empty_heads():
    t = _t(
        "a.jinja",
        "A long enough static head for priming, well over one whole block of pseudo tokens. "
        "{{ x }}",
    )
    empty = _t("b.jinja", "{{ bos_token }}{{ x }}")
    short = _t("c.jinja", "<|system|>{{ x }}")  # under one cache block: nothing to prime
    plan = rewarm_set(classify({}, {"a.jinja": t, "b.jinja": empty, "c.jinja": short}, {}))
    (item,) = rewarm_items(plan, "llama", {"a.jinja": 7})
    assert item.kind == "prefix" and item.text == t.static_prefix and item.predicted_hits == 7
    assert item.template == version_tag(t) and t.version in item.key
