"""What a template may cost to parse, checked before the parser starts, and the loader that
resolves ``include``/``import``/``extends`` only inside the repository.

Jinja2's parser recurses: 20,000 nested ``{% if %}`` or 100,000 parentheses overflow it, and a
50 MB template takes a minute and 760 MB. Size, token count and the nesting of tags and
brackets are counted here on the lexer's token stream (which does not recurse), and the parsed
tree's depth with a stack, so such templates are a :class:`BadInputError` naming the file and
line. Names in ``include``, ``import`` and ``extends`` are repository paths: a constant one
leaving the repository is refused at parse time, and :class:`RepoLoader` refuses anything
outside its files when asked at render time.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from jinja2 import BaseLoader, Environment, TemplateNotFound, nodes
from jinja2.exceptions import TemplateSyntaxError

from pipeline.errors import BadInputError

# Compiled templates' file names start with this: the render's tracer follows only them.
TEMPLATE_FILE = "<template "

# Compiled templates' file names start with this: the render's tracer follows only them.
TEMPLATE_FILE = "<template "


@dataclass(frozen=True, slots=True)
class TemplateLimits:
    """What one template may cost.

    Parse side: ``max_bytes`` of source, ``max_nesting`` of tags and brackets together (real
    chat templates nest under 10; Jinja's parser recurses on brackets and overflows near 100,
    and Python refuses compiled code nested more than 20 loops deep), ``max_tokens`` lexer
    tokens and ``max_tree_depth`` of the parsed tree (the code generator recurses on it, and
    its constant folding grows steeply with depth: 100 nested ``not`` compile in over 1 s).
    Render side: ``max_seconds`` of wall time, ``max_steps`` template lines executed,
    ``max_range`` items per ``range()``, ``max_output_chars`` rendered (also the cap on any
    string built along the way), ``max_power_bits`` of a power's result.
    """

    max_bytes: int = 1024 * 1024
    max_nesting: int = 32
    max_tokens: int = 100_000
    max_tree_depth: int = 64
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


def where_of(name: str, line: object) -> str:
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
            where=where_of(name, 1),
        )
    tags = brackets = tokens = 0
    after_block_begin = False
    try:
        for line, kind, value in Environment().lex(source):
            tokens += 1
            if tokens > limits.max_tokens:
                raise BadInputError(
                    f"template has over {limits.max_tokens} tokens", where=where_of(name, line)
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
                    where=where_of(name, line),
                )
    except TemplateSyntaxError as exc:
        where = where_of(name, exc.lineno)
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
                where=where_of(name, getattr(node, "lineno", 1)),
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
            raise BadInputError("template name must be a string", where=where_of(name, line))
        try:
            repo_relative_path(target)
        except BadInputError as exc:
            raise BadInputError(
                f"{type(node).__name__.lower()} of {target!r} refused: {exc}",
                where=where_of(name, line),
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
        return source, f"{TEMPLATE_FILE}{path}>", lambda: True
