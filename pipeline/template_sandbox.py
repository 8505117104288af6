"""The bounded Jinja2 sandbox: what a template may cost to parse and to render.

Jinja2's :class:`ImmutableSandboxedEnvironment` stops templates from reaching Python's
internals, but not from costing too much: ``{{ 9**(9**(9**9)) }}`` never returns, nested
``range(100000)`` loops run for hours, 20,000 nested ``{% if %}`` overflow the parser's
recursion. Here every template is checked before any of that work starts — size, nesting of
tags and brackets (counted on the lexer's token stream, which does not recurse), number of
tokens, depth of the parsed tree — and rendering runs with a deadline and budgets on range
length, loop steps, powers, repetition, formatting widths and output length. Every refusal is
a :class:`BadInputError` naming the template and line.

``include``, ``import`` and ``extends`` resolve only through :class:`RepoLoader`: names are
repository paths, checked at parse time (a constant name leaving the repository is refused
before anything renders) and again when the loader is asked.
"""

from __future__ import annotations

import posixpath
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

from jinja2 import BaseLoader, Environment, TemplateNotFound, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from pipeline.errors import BadInputError

Clock = Callable[[], float]
# Compiled templates' file names start with this: the render's tracer follows only them.
_TEMPLATE_FILE = "<template "


@dataclass(frozen=True, slots=True)
class TemplateLimits:
    """What one template may cost.

    Parse side: ``max_bytes`` of source, ``max_nesting`` of tags and brackets together (real
    chat templates nest under 10; Jinja's parser recurses on brackets and overflows near 100,
    and Python refuses compiled code nested more than 20 loops deep), ``max_tokens`` lexer
    tokens and ``max_tree_depth`` of the parsed tree (the code generator recurses on it).
    Render side: ``max_seconds`` of wall time, ``max_steps`` template lines executed,
    ``max_range`` items per ``range()``, ``max_output_chars`` rendered (also the cap on any
    string built along the way), ``max_power_bits`` of a power's result.
    """

    max_bytes: int = 1024 * 1024
    max_nesting: int = 32
    max_tokens: int = 100_000
    max_tree_depth: int = 120
    max_seconds: float = 2.0
    max_steps: int = 2_000_000
    max_range: int = 10_000
    max_output_chars: int = 1_000_000
    max_power_bits: int = 4096


DEFAULT_TEMPLATE_LIMITS = TemplateLimits()

_OPENING_TAGS = frozenset(
    {"if", "for", "macro", "call", "filter", "block", "with", "autoescape", "trans"}
)
_OPENING_BRACKETS = frozenset("([{")
_CLOSING_BRACKETS = frozenset(")]}")
_REFERENCES = (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)
# printf-style and str.format widths/precisions: a huge one allocates a huge string.
_PRINTF_WIDTH = re.compile(r"%[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_FORMAT_SPEC = re.compile(r"\{[^{}]*:([^{}]*)\}")
_DIGITS = re.compile(r"\d+")


class _LimitExceeded(Exception):
    """Raised inside a render when a budget runs out (turned into a BadInputError)."""


def _where(name: str, line: object) -> str:
    return f"{name}:{line}"


def repo_relative_path(path: str) -> str:
    """``path`` normalised inside a repository; absolute paths and ``..`` are refused."""
    if not path or path.startswith(("/", "\\")) or (len(path) > 1 and path[1] == ":"):
        raise BadInputError("absolute path leaves the repository", where=path or "(empty path)")
    normal = posixpath.normpath(path.replace("\\", "/"))
    if normal == ".." or normal.startswith("../"):
        raise BadInputError("path leaves the repository", where=path)
    return normal


# --- before parsing -----------------------------------------------------------------------


def check_source(source: str, name: str, limits: TemplateLimits = DEFAULT_TEMPLATE_LIMITS) -> None:
    """Size, token count and nesting of ``source``, checked on the lexer's stream (no parse)."""
    size = len(source.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise BadInputError(
            f"template of {size} bytes is over the limit of {limits.max_bytes}",
            where=_where(name, 1),
        )
    tags = brackets = tokens = 0
    after_block_begin = False
    try:
        for line, kind, value in Environment().lex(source):
            tokens += 1
            if tokens > limits.max_tokens:
                raise BadInputError(
                    f"template has over {limits.max_tokens} tokens", where=_where(name, line)
                )
            if kind == "whitespace":
                continue
            if after_block_begin and kind == "name":
                tags += 1 if value in _OPENING_TAGS else (-1 if value.startswith("end") else 0)
                tags = max(tags, 0)
            after_block_begin = kind == "block_begin"
            if kind == "operator" and value in _OPENING_BRACKETS:
                brackets += 1
            elif kind == "operator" and value in _CLOSING_BRACKETS:
                brackets = max(brackets - 1, 0)
            if tags + brackets > limits.max_nesting:
                raise BadInputError(
                    f"tags and brackets nested deeper than {limits.max_nesting}",
                    where=_where(name, line),
                )
    except TemplateSyntaxError as exc:
        where = _where(name, exc.lineno)
        raise BadInputError(f"Jinja2 syntax error: {exc.message}", where=where) from exc


def check_tree(
    tree: nodes.Template, name: str, limits: TemplateLimits = DEFAULT_TEMPLATE_LIMITS
) -> None:
    """Depth of the parsed tree (walked with a stack, not recursion) and its references."""
    stack: list[tuple[nodes.Node, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limits.max_tree_depth:
            raise BadInputError(
                f"expression or tags nested deeper than {limits.max_tree_depth}",
                where=_where(name, getattr(node, "lineno", 1)),
            )
        if isinstance(node, _REFERENCES):
            check_reference(node, name)
        stack.extend((child, depth + 1) for child in node.iter_child_nodes())


def _constant_names(expr: nodes.Expr) -> list[object]:
    if isinstance(expr, nodes.Const):
        return [expr.value]
    if isinstance(expr, nodes.List | nodes.Tuple):
        return [item.value for item in expr.items if isinstance(item, nodes.Const)]
    return []  # computed at render time: the loader checks it then


def check_reference(node: nodes.Node, name: str) -> None:
    """An include/import/extends of a constant path must stay inside the repository."""
    line = getattr(node, "lineno", 1)
    for target in _constant_names(node.template):  # type: ignore[attr-defined]
        if not isinstance(target, str):
            raise BadInputError("template name must be a string", where=_where(name, line))
        try:
            repo_relative_path(target)
        except BadInputError as exc:
            raise BadInputError(
                f"{type(node).__name__.lower()} of {target!r} refused: {exc}",
                where=_where(name, line),
            ) from exc


# --- the loader ---------------------------------------------------------------------------


class RepoLoader(BaseLoader):
    """Templates by repository path from ``files`` (path → source), and nothing else.

    A name leaving the repository is a :class:`BadInputError`; one that is not in ``files``
    is not found. Every source it hands out passes :func:`check_source` first.
    """

    def __init__(
        self, files: Mapping[str, str], limits: TemplateLimits = DEFAULT_TEMPLATE_LIMITS
    ) -> None:
        self.files, self.limits = dict(files), limits

    def get_source(
        self, environment: Environment, template: str
    ) -> tuple[str, str | None, Callable[[], bool] | None]:
        path = repo_relative_path(template)
        if path not in self.files:
            raise TemplateNotFound(template)
        source = self.files[path]
        check_source(source, path, self.limits)
        return source, f"{_TEMPLATE_FILE}{path}>", lambda: True


# --- rendering ----------------------------------------------------------------------------


class _Budget:
    """The deadline and step budget of one render, ticked from template code."""

    def __init__(self, limits: TemplateLimits, clock: Clock) -> None:
        self.limits, self.clock = limits, clock
        self.deadline = clock() + limits.max_seconds
        self.steps = 0

    def tick(self, steps: int = 1) -> None:
        self.steps += steps
        if self.steps > self.limits.max_steps:
            raise _LimitExceeded(f"render took over {self.limits.max_steps} steps")
        if self.clock() > self.deadline:
            raise _LimitExceeded(f"render took over {self.limits.max_seconds:g}s")

    def size(self, value: object) -> None:
        if isinstance(value, str | bytes | list | tuple | dict) and (
            len(value) > self.limits.max_output_chars
        ):
            raise _LimitExceeded(f"a value over {self.limits.max_output_chars} items")

    def number(self, value: object) -> None:
        if isinstance(value, int) and abs(value) > self.limits.max_output_chars:
            raise _LimitExceeded(f"a count or width over {self.limits.max_output_chars}")


def _bounded_range(budget: _Budget) -> Callable[..., Iterator[int]]:
    def bounded(*args: int) -> Iterator[int]:
        numbers = range(*args)
        if len(numbers) > budget.limits.max_range:
            raise _LimitExceeded(f"range of {len(numbers)} items (limit {budget.limits.max_range})")
        for number in numbers:
            budget.tick()
            yield number

    return bounded


class _BoundedBuffer(list[str]):
    """A macro's or block's output buffer that refuses to grow past the output limit."""

    def __init__(self, budget: _Budget) -> None:
        super().__init__()
        self.budget, self.length = budget, 0

    def _grow(self, added: int) -> None:
        self.length += added
        if self.length > self.budget.limits.max_output_chars:
            raise _LimitExceeded(f"output over {self.budget.limits.max_output_chars} characters")

    def append(self, item: str) -> None:
        self._grow(len(item))
        super().append(item)

    def extend(self, items: Any) -> None:
        items = list(items)
        self._grow(sum(len(item) for item in items))
        super().extend(items)


class _BoundedNamespace(Namespace):
    """``namespace()`` whose attributes are size-checked when set (loops can grow them)."""

    budget: _Budget

    def __setitem__(self, name: str, value: Any) -> None:
        type(self).budget.size(value)
        super().__setitem__(name, value)


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator with ``~`` joins and output buffers that check their size."""

    def buffer(self, frame: Frame) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.output_buffer()")

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.bounded_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


def _check_format_string(text: str, budget: _Budget) -> None:
    specs = [m.group(1) for m in _FORMAT_SPEC.finditer(text)]
    widths = [w for m in _PRINTF_WIDTH.finditer(text) for w in m.groups() if w]
    for value in [*widths, *(d for spec in specs for d in _DIGITS.findall(spec))]:
        if value == "*" or int(value) > budget.limits.max_output_chars:
            raise _LimitExceeded(f"format width {value} refused")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with a budget on every operation that can cost without bound."""

    intercepted_binops = frozenset({"**", "*", "%", "+"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, budget: _Budget, loader: BaseLoader) -> None:
        super().__init__(autoescape=False, keep_trailing_newline=True, loader=loader)
        self.budget = budget
        self.globals["range"] = _bounded_range(budget)
        self.globals["namespace"] = type("namespace", (_BoundedNamespace,), {"budget": budget})
        self.filters = {name: self._guarded(f) for name, f in self.filters.items()}

    def output_buffer(self) -> _BoundedBuffer:
        """A fresh output buffer for a macro, call block or block ``set``."""
        return _BoundedBuffer(self.budget)

    def bounded_join(self, items: tuple[Any, ...]) -> str:
        """``a ~ b ~ …``, refused before joining when the result would be over the limit."""
        parts = [str(item) for item in items]
        if sum(len(part) for part in parts) > self.budget.limits.max_output_chars:
            raise _LimitExceeded(f"a string over {self.budget.limits.max_output_chars} characters")
        return "".join(parts)

    def _guarded(self, func: Callable[..., Any]) -> Callable[..., Any]:
        budget = self.budget

        # The value (and the context or environment of pass_* filters) comes first; counts and
        # widths (center, indent, wordwrap, batch, slice, truncate …) after, and stay bounded.
        skip = 2 if hasattr(func, "jinja_pass_arg") else 1
        is_replace = getattr(func, "__name__", "") == "do_replace"

        def guarded(*args: Any, **kwargs: Any) -> Any:
            budget.tick()
            for arg in (*args, *kwargs.values()):
                budget.size(arg)
            for arg in (*args[skip:], *kwargs.values()):
                if not isinstance(arg, bool):
                    budget.number(arg)
            if is_replace:
                _check_replace(budget, args[skip - 1 :], kwargs)
            result = func(*args, **kwargs)
            budget.size(result)
            return result

        if hasattr(func, "jinja_pass_arg"):
            guarded.jinja_pass_arg = func.jinja_pass_arg  # type: ignore[attr-defined]
        return guarded

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self.budget.tick()
        if operator == "**":
            _check_power(left, right, self.budget.limits.max_power_bits)
        elif operator == "*":
            _check_product(left, right, self.budget)
        elif operator == "%" and isinstance(left, str):
            _check_format_string(left, self.budget)
        result = super().call_binop(context, operator, left, right)
        self.budget.size(result)
        return result

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, str) and attribute in ("format", "format_map"):
            _check_format_string(obj, self.budget)
        return super().getattr(obj, attribute)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        __self.budget.tick()
        bound_to = getattr(__obj, "__self__", None)
        for arg in (*args, *kwargs.values()):
            __self.budget.size(arg)
            if isinstance(bound_to, str | bytes | list) and not isinstance(arg, bool):
                __self.budget.number(arg)
        if isinstance(bound_to, str) and getattr(__obj, "__name__", "") == "replace":
            _check_replace(__self.budget, (bound_to, *args), kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        __self.budget.size(result)
        return result


def _check_replace(budget: _Budget, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """``s.replace(old, new[, count])`` (method or filter): refuse a result over the limit
    before building it."""
    text, old, new = [*args, None, None, None][:3]
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str)):
        return
    hits = text.count(old) if old else len(text) + 1
    if len(text) + hits * max(len(new) - len(old), 0) > budget.limits.max_output_chars:
        raise _LimitExceeded(f"replace result over {budget.limits.max_output_chars} characters")


def _check_power(left: Any, right: Any, max_bits: int) -> None:
    if not (isinstance(left, int | float) and isinstance(right, int | float)):
        return
    if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        if left.bit_length() * right > max_bits:
            raise _LimitExceeded(f"power with a result over {max_bits} bits refused")
    elif abs(right) > max_bits:
        raise _LimitExceeded(f"power with an exponent over {max_bits} refused")


def _check_product(left: Any, right: Any, budget: _Budget) -> None:
    count, other = (left, right) if isinstance(left, int) else (right, left)
    if not isinstance(count, int) or isinstance(count, bool):
        return
    if isinstance(other, str | bytes | list | tuple):
        if len(other) * max(count, 0) > budget.limits.max_output_chars:
            raise _LimitExceeded(f"repetition over {budget.limits.max_output_chars} items")
    elif isinstance(other, int) and count.bit_length() + other.bit_length() > 4 * 4096:
        raise _LimitExceeded("product of very large numbers refused")


def _template_line(tb: TracebackType | None, filename: str) -> int | str:
    line: int | str = "?"
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


_RENDER_ERRORS = (
    TemplateError, ArithmeticError, TypeError, ValueError, LookupError, AttributeError,
    RecursionError, SyntaxError, MemoryError, _LimitExceeded,
)  # fmt: skip


def _traced(budget: _Budget, filename: str) -> Callable[[FrameType, str, Any], Any]:
    def line_events(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            budget.tick()
        return line_events

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        # Only templates' own compiled code is traced; library code runs untraced.
        if event == "call" and frame.f_code.co_filename.startswith(_TEMPLATE_FILE):
            return line_events
        return None

    return calls


def render_bounded(
    source: str,
    name: str,
    context: Mapping[str, Any],
    files: Mapping[str, str] | None = None,
    limits: TemplateLimits = DEFAULT_TEMPLATE_LIMITS,
    clock: Clock = time.monotonic,
) -> str:
    """Render ``source`` in the bounded sandbox; includes come from ``files`` only.

    Every failure the template can cause — a budget, a sandbox refusal, a type or arithmetic
    error, a missing include — is a :class:`BadInputError` naming ``name`` and the line.
    """
    budget = _Budget(limits, clock)
    env = BoundedSandbox(budget, RepoLoader(files or {}, limits))
    filename = f"{_TEMPLATE_FILE}{name}>"
    out: list[str] = []
    length = 0
    previous = sys.gettrace()
    sys.settrace(_traced(budget, filename))
    try:
        code = env.compile(source, name, filename)
        template = env.template_class.from_code(env, code, env.make_globals(None))
        for chunk in template.generate(**context):
            length += len(chunk)
            if length > limits.max_output_chars:
                raise _LimitExceeded(f"output over {limits.max_output_chars} characters")
            out.append(chunk)
    except BadInputError as exc:  # from the loader: an include refused or over a limit
        line = _template_line(exc.__traceback__, filename)
        raise BadInputError(f"cannot render ({exc})", where=_where(name, line)) from exc
    except SecurityError as exc:
        line = _template_line(exc.__traceback__, filename)
        raise BadInputError(f"sandbox refused: {exc}", where=_where(name, line)) from exc
    except TemplateNotFound as exc:
        line = _template_line(exc.__traceback__, filename)
        reason = f"no template {exc.name!r} in the repository"
        raise BadInputError(f"cannot render ({reason})", where=_where(name, line)) from exc
    except _RENDER_ERRORS as exc:
        line = getattr(exc, "lineno", None) or _template_line(exc.__traceback__, filename)
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise BadInputError(f"cannot render ({reason})", where=_where(name, line)) from exc
    finally:
        sys.settrace(previous)
    return "".join(out)
