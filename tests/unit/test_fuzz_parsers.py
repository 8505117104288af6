"""Generated templates, tokenizer configs, Python prompt modules and webhook bodies, fed to every
parser and renderer of untrusted text: nothing but the documented bad-input errors comes out,
no call runs past its time limit, and memory stays bounded.

Bounded: each test runs a fixed number of examples (``max_examples``), each call is timed and
its allocations traced; the generators reach the shapes that once crashed or hung prewarm
(deep nesting, huge powers and ranges, includes leaving the repository, odd JSON) as well as
random text.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.webhooks import GITEA, GITHUB, GITLAB, PAYLOAD_LIMITS, Refused, _payload
from pipeline.errors import BadInputError
from pipeline.limits import load_json
from pipeline.templates import TemplateLimits, render, templates_in_file

# Render budget for the fuzz run: short, so a runaway shows up fast.
LIMITS = TemplateLimits(max_seconds=0.5)
# Wall-time ceiling per call on a loaded shared machine: the limit plus room for the machine.
PARSE_CEILING_S = 10.0
RENDER_CEILING_S = LIMITS.max_seconds + 5.0
MEMORY_CEILING_MB = 200.0
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def bounded_call(func: Callable[[], Any], ceiling_s: float, allowed: tuple[type, ...]) -> Any:
    """Run ``func``; only ``allowed`` errors may escape; time and peak memory are checked."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        return func()
    except allowed as exc:
        return exc
    finally:
        elapsed = time.monotonic() - started
        peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
        tracemalloc.stop()
        assert elapsed < ceiling_s, f"call took {elapsed:.1f}s"
        assert peak_mb < MEMORY_CEILING_MB, f"call allocated {peak_mb:.0f} MB"


# --- generators ------------------------------------------------------------------------------

NAMES = st.sampled_from(["x", "messages", "m", "loop", "name", "ns", "range", "cycler", "lipsum"])
NUMBERS = st.one_of(
    st.integers(-10, 10), st.integers(-(10**12), 10**12), st.floats(allow_nan=True)
).map(repr)
STRINGS = st.text(max_size=20).map(json.dumps)
PATHS = st.sampled_from(["part.j2", "../x.j2", "/etc/passwd", "a/../../b", "missing.j2", "self.j2"])


def expressions() -> st.SearchStrategy[str]:
    leaf = st.one_of(NUMBERS, STRINGS, NAMES)
    return st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.tuples(inner, st.sampled_from(["**", "*", "+", "-", "%", "//", "~", "/", "<"]),
                      inner).map(" ".join),
            inner.map(lambda e: f"({e})"),
            st.tuples(inner, st.sampled_from(["e", "length", "center(10**9)", "replace('a',"
                      "'b'*99)", "batch(3)", "list", "join", "int", "slice(10**7)", "format(1)"]))
            .map(lambda p: f"{p[0]}|{p[1]}"),
            st.lists(inner, max_size=3).map(lambda xs: f"range({', '.join(xs)})"),
            st.lists(inner, max_size=3).map(lambda xs: f"[{', '.join(xs)}]"),
            st.tuples(inner, st.sampled_from(["upper()", "center(10**9)", "format(1)", "__class__",
                      "items()", "join([])"])).map(lambda p: f"{p[0]}.{p[1]}"),
            st.tuples(st.sampled_from(["(", "[", "not "]), st.integers(1, 3000), inner)
            .map(lambda p: p[0] * p[1] + p[2] + {"(": ")", "[": "]", "not ": ""}[p[0]] * p[1]),
        ),
        max_leaves=12,
    )  # fmt: skip


def templates() -> st.SearchStrategy[str]:
    expr = expressions()
    text = st.text(max_size=30)
    leaf = st.one_of(text, expr.map(lambda e: "{{ " + e + " }}"))
    body = st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4).map("".join),
            st.tuples(expr, inner).map(lambda p: f"{{% if {p[0]} %}}{p[1]}{{% endif %}}"),
            st.tuples(expr, inner).map(lambda p: f"{{% for i in {p[0]} %}}{p[1]}{{% endfor %}}"),
            st.tuples(expr, inner).map(
                lambda p: f"{{% macro m(n) %}}{p[1]}{{{{ m({p[0]}) }}}}{{% endmacro %}}"
                "{{ m(1) }}"
            ),
            st.tuples(expr, inner).map(
                lambda p: f"{{% set ns = namespace(s={p[0]}) %}}{{% for i in range(50) %}}"
                f"{{% set ns.s = ns.s ~ ns.s %}}{{% endfor %}}{p[1]}"
            ),
            PATHS.map(lambda p: f"{{% include {p!r} %}}"),
            PATHS.map(lambda p: f"{{% import {p!r} as lib %}}"),
            PATHS.map(lambda p: f"{{% extends {p!r} %}}"),
            st.tuples(st.sampled_from(["if x", "for a in x", "with"]), st.integers(1, 30_000))
            .map(lambda p: f"{{% {p[0]} %}}" * p[1] + "{% end" + p[0].split()[0] + " %}" * p[1]),
        ),
        max_leaves=10,
    )  # fmt: skip
    return st.one_of(body, st.text(alphabet="{}%#()[]-+*~|.'\"xif endor \n", max_size=400))


def json_values() -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                    max_size=4),
        max_leaves=20,
    )  # fmt: skip


def json_documents() -> st.SearchStrategy[bytes]:
    deep = st.tuples(st.sampled_from(["[", '{"a":']), st.integers(1, 100_000)).map(
        lambda p: (p[0] * p[1] + "1" + ("]" if p[0] == "[" else "}") * p[1]).encode()
    )
    odd = st.sampled_from(
        [b"NaN", b'{"ref": Infinity}', b"9" * 5000, b'"\\ud800"', b"\xff\xfe", b"", b"[" * 10,
         b'{"a": 1, "a": 2}', b"1e99999", b'{"repository": {"full_name": 5}, "ref": []}']
    )  # fmt: skip
    return st.one_of(json_values().map(lambda v: json.dumps(v).encode()), deep, odd, st.binary())


def tokenizer_configs() -> st.SearchStrategy[bytes]:
    chat = st.one_of(
        templates(),
        st.lists(st.fixed_dictionaries({"name": st.text(max_size=8), "template": templates()}),
                 max_size=3),
        json_values(),
    )  # fmt: skip
    documents = st.fixed_dictionaries({"chat_template": chat}, optional={"x": json_values()})
    return st.one_of(documents.map(lambda d: json.dumps(d).encode()), json_documents())


def python_modules() -> st.SearchStrategy[str]:
    assignment = st.tuples(
        st.sampled_from(["A", "B", "__doc__", "_private"]),
        st.one_of(templates().map(repr), templates().map(lambda t: "f" + repr(t)), NUMBERS),
    ).map(lambda p: f"{p[0]} = {p[1]}")
    deep = st.integers(1, 100_000).map(lambda n: "X = " + "(" * n + "1" + ")" * n)
    return st.one_of(st.lists(assignment, max_size=4).map("\n".join), deep, st.text(max_size=300))


# --- the parsers ----------------------------------------------------------------------------

FILES = {"part.j2": "part {{ x }}", "self.j2": "{% include 'self.j2' %}"}


def _parse_and_render(path: str, data: bytes) -> None:
    found = bounded_call(lambda: templates_in_file(path, data), PARSE_CEILING_S, (BadInputError,))
    if isinstance(found, BadInputError):
        assert found.where and found.where.startswith(path), found
        return
    context = {"x": [1, 2], "messages": [{"role": "user", "content": "hi"}], "name": "N"}
    for template in found:
        if template.kind == "python" and "{" not in template.source:
            continue
        bounded_call(
            lambda t=template: render(t, context, FILES, limits=LIMITS),
            RENDER_CEILING_S,
            (BadInputError,),
        )


@FUZZ
@given(templates())
def test_generated_jinja_templates_parse_and_render_within_limits(source):
    _parse_and_render("prompts/fuzz.jinja", source.encode("utf-8", "surrogatepass"))


@FUZZ
@given(tokenizer_configs())
def test_generated_tokenizer_configs_parse_within_limits(data):
    _parse_and_render("model/tokenizer_config.json", data)


@FUZZ
@given(python_modules())
def test_generated_python_prompt_modules_parse_within_limits(source):
    _parse_and_render("app/prompts.py", source.encode("utf-8", "surrogatepass"))


@FUZZ
@given(json_documents(), st.booleans())
def test_generated_webhook_bodies_are_parsed_or_refused_with_a_status(body, form):
    from urllib.parse import urlencode

    if form:
        body = urlencode({"payload": body.decode("latin-1")}).encode()
    content_type = "application/x-www-form-urlencoded" if form else "application/json"
    request = SimpleNamespace(headers={"content-type": content_type})
    payload = bounded_call(lambda: _payload(request, body), PARSE_CEILING_S, (Refused,))
    if isinstance(payload, Refused):
        assert payload.status == 422
        return
    for forge in (GITHUB, GITLAB, GITEA):
        refused = bounded_call(lambda f=forge: f.push(payload), PARSE_CEILING_S, (Refused,))
        assert not isinstance(refused, Refused) or refused.status == 422


@FUZZ
@given(json_documents())
def test_generated_json_is_loaded_or_bad_input(data):
    result = bounded_call(
        lambda: load_json(data, "doc", PAYLOAD_LIMITS), PARSE_CEILING_S, (BadInputError,)
    )
    if isinstance(result, BadInputError):
        assert str(result).startswith("doc:")
