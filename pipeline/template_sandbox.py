"""The bounded Jinja2 sandbox: what a template may cost to render.

Jinja2's :class:`ImmutableSandboxedEnvironment` stops templates from reaching Python's
internals, but not from costing too much: ``{{ 9**(9**(9**9)) }}`` never returns, nested
``range(100000)`` loops run for hours. Here rendering runs with a deadline and budgets on
template steps, range length, powers, repetition, formatting widths, string and output length;
templates are checked first by :mod:`pipeline.template_limits`, and includes resolve only
through its :class:`RepoLoader`. Every refusal is a :class:`BadInputError` naming the template
and line.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from types import FrameType, TracebackType
from typing import Any

from jinja2 import BaseLoader, TemplateNotFound, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from pipeline.errors import BadInputError
from pipeline.template_limits import (
    DEFAULT_TEMPLATE_LIMITS,
    TEMPLATE_FILE,
    RepoLoader,
    TemplateLimits,
    where_of,
)

Clock = Callable[[], float]
# printf-style and str.format widths/precisions: a huge one allocates a huge string.
_PRINTF_WIDTH = re.compile(r"%[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_FORMAT_SPEC = re.compile(r"\{[^{}]*:([^{}]*)\}")
_DIGITS = re.compile(r"\d+")


class _LimitExceeded(Exception):
    """Raised inside a render when a budget runs out (turned into a BadInputError)."""


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
    line: int | str = 1  # no template frame: the failure is the template as a whole
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
        if event == "call" and frame.f_code.co_filename.startswith(TEMPLATE_FILE):
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
    filename = f"{TEMPLATE_FILE}{name}>"
    out: list[str] = []
    length = 0
    previous = sys.gettrace()
    try:
        # Compiled untraced: a tracer sees every call of Jinja's compiler, which made a
        # 100-deep expression take seconds; the budget's clock already runs.
        code = env.compile(source, name, filename)
        template = env.template_class.from_code(env, code, env.make_globals(None))
        budget.tick()
        sys.settrace(_traced(budget, filename))
        for chunk in template.generate(**context):
            length += len(chunk)
            if length > limits.max_output_chars:
                raise _LimitExceeded(f"output over {limits.max_output_chars} characters")
            out.append(chunk)
    except BadInputError as exc:  # from the loader: an include refused or over a limit
        line = _template_line(exc.__traceback__, filename)
        raise BadInputError(f"cannot render ({exc})", where=where_of(name, line)) from exc
    except SecurityError as exc:
        line = _template_line(exc.__traceback__, filename)
        raise BadInputError(f"sandbox refused: {exc}", where=where_of(name, line)) from exc
    except TemplateNotFound as exc:
        line = _template_line(exc.__traceback__, filename)
        reason = f"no template {exc.name!r} in the repository"
        raise BadInputError(f"cannot render ({reason})", where=where_of(name, line)) from exc
    except _RENDER_ERRORS as exc:
        line = getattr(exc, "lineno", None) or _template_line(exc.__traceback__, filename)
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise BadInputError(f"cannot render ({reason})", where=where_of(name, line)) from exc
    finally:
        sys.settrace(previous)
    return "".join(out)
