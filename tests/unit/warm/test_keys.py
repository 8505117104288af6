"""The versioned cache key scheme."""

from __future__ import annotations

import pytest

from pipeline.errors import BadInputError
from pipeline.keys import (
    CacheKey,
    decode_value,
    encode_value,
    params_hash,
    response_key,
    system_prompt_hash,
    tenant_namespace,
)


def _key(**overrides):
    base = {"model": "m1", "template": "greet@3", "params": {"temperature": 0.0},
            "text": "hello", "tenant": "acme"}  # fmt: skip
    base.update(overrides)
    return response_key(**base).render()


def test_every_part_changes_the_key():
    base = _key()
    variants = [
        _key(model="m2"),
        _key(template="greet@4"),
        _key(params={"temperature": 0.5}),
        _key(text="hello!"),
        _key(tenant="other"),
    ]
    assert len({base, *variants}) == 6


def test_key_round_trips_and_lives_in_the_tenant_namespace():
    rendered = _key(model="org/model:v1")
    parsed = CacheKey.parse(rendered)
    assert parsed.render() == rendered
    assert rendered.startswith(tenant_namespace("acme"))
    assert parsed.kind == "response"


def test_params_hash_ignores_order_and_unset_values():
    assert params_hash({"a": 1, "b": None, "c": 2}) == params_hash({"c": 2, "a": 1})
    assert params_hash({"a": 1}) != params_hash({"a": 2})


def test_messages_and_text_hash_differently():
    by_text = _key(text="hi")
    by_messages = response_key(model="m1", template=system_prompt_hash("s"), params={},
                               messages=[{"role": "user", "content": "hi"}]).render()  # fmt: skip
    assert by_text != by_messages
    assert system_prompt_hash("s").startswith("sp-")


def test_foreign_keys_and_values_are_bad_input():
    with pytest.raises(BadInputError):
        CacheKey.parse("something:else")
    with pytest.raises(BadInputError):
        decode_value(b"\x80\x04pickle")
    assert decode_value(encode_value({"text": "x"})) == {"text": "x"}
    assert decode_value(None) is None
