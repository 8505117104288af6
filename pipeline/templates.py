"""Prompt templates read from repository files, with their fingerprints and warmable head.

Three sources: Jinja2 files (``*.jinja``, ``*.j2``, ``chat_template.jinja``), chat templates in
``tokenizer_config.json`` (a string, or a list of ``{"name", "template"}``), and Python prompt
modules, whose module-level strings and f-strings are read with :mod:`ast` — never imported or run.

Each template gets a *structural* fingerprint (node kinds, variables, blocks, calls, filters;
literal text ignored), a *content* fingerprint (everything) and its *static prefix*: the literal
head up to the first variable or tag, which is what can be primed into an engine's prefix cache.

Jinja2 is parsed and rendered only in :class:`ImmutableSandboxedEnvironment`, and a template that
reaches for private attributes (``''.__class__.__mro__``, ``cycler.__init__.__globals__``,
``self._TemplateReference__context``) is refused before anything renders it.
"""

from __future__ import annotations

import ast
import hashlib
import posixpath
import string
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jinja2 import nodes
from jinja2.exceptions import TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pipeline.errors import BadInputError
from pipeline.limits import TextLimits, load_json
from pipeline.template_limits import (
    DEFAULT_TEMPLATE_LIMITS,
    TemplateLimits,
    check_source,
    check_tree,
    repo_relative_path,
)
from pipeline.template_sandbox import Clock, render_bounded

__all__ = ["DEFAULT_TEMPLATE_LIMITS", "TemplateLimits", "repo_relative_path"]

TemplateKind = Literal["jinja", "chat", "python"]

JINJA_SUFFIXES = (".jinja", ".jinja2", ".j2")
CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"

# Skipped when computing the static prefix: comments do not render, so text after them still does.
_COMMENT_TOKENS = frozenset({"comment_begin", "comment", "comment_end", "linecomment"})
# Jinja delimiters; a Python string with none of them is a str.format template, not Jinja.
_JINJA_MARKERS = ("{{", "{%", "{#")
# tokenizer_config.json: real ones are flat (depth 3–4) and under 100 kB without their vocab.
CONFIG_LIMITS = TextLimits(max_bytes=DEFAULT_TEMPLATE_LIMITS.max_bytes, max_depth=32)


def sandbox() -> ImmutableSandboxedEnvironment:
    """A fresh sandboxed Jinja2 environment: the only way prewarm parses or renders templates."""
    return ImmutableSandboxedEnvironment(autoescape=False, keep_trailing_newline=True)


@dataclass(frozen=True, slots=True)
class Template:
    """One prompt template at one version.

    ``template_id`` is ``path`` for a whole file and ``path#name`` for a named template inside one
    (a chat template in ``tokenizer_config.json``, a string in a Python module).
    """

    template_id: str
    path: str
    kind: TemplateKind
    source: str
    structure: str
    content: str
    static_prefix: str

    @property
    def version(self) -> str:
        """Short content fingerprint: a cache key carries it, so an edit never serves stale data."""
        return self.content[:16]


def _digest(*parts: str) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part.encode())
        hasher.update(b"\x00")
    return hasher.hexdigest()


# --- paths -------------------------------------------------------------------------------------


def check_symlink(path: str, target: str) -> str:
    """The repository path a symlink at ``path`` points to; a target outside is refused."""
    if target.startswith("/"):
        raise BadInputError(f"symlink points outside the repository (to {target})", where=path)
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if joined == ".." or joined.startswith("../"):
        raise BadInputError(f"symlink points outside the repository (to {target})", where=path)
    return joined


# --- Jinja2 ------------------------------------------------------------------------------------


def _private(name: object) -> bool:
    # The sandbox itself treats every underscore name as unsafe; refusing them up front gives a
    # clear error instead of a silent Undefined at render time.
    return isinstance(name, str) and name.startswith("_")


def _escape_attempt(node: nodes.Node) -> str | None:
    if isinstance(node, nodes.Getattr) and _private(node.attr):
        return f"attribute {node.attr!r}"
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        return f"item {node.arg.value!r}" if _private(node.arg.value) else None
    if isinstance(node, nodes.Filter) and node.name == "attr" and node.args:
        arg = node.args[0]
        if not isinstance(arg, nodes.Const):
            return "a computed attribute name (|attr)"
        return f"attribute {arg.value!r}" if _private(arg.value) else None
    return None


def _refuse_escapes(tree: nodes.Template, where: str) -> None:
    for node in tree.find_all(nodes.Node):
        attempt = _escape_attempt(node)
        if attempt is not None:
            line = getattr(node, "lineno", "?")
            raise BadInputError(
                f"template reaches for {attempt}: sandbox escape refused", where=f"{where}:{line}"
            )


def parse_jinja(
    source: str, where: str, limits: TemplateLimits = DEFAULT_TEMPLATE_LIMITS
) -> nodes.Template:
    """Parse ``source`` in the sandbox after checking its size and nesting; syntax errors,
    limits, escapes and references leaving the repository are :class:`BadInputError`."""
    check_source(source, where, limits)
    try:
        tree = sandbox().parse(source)
    except TemplateSyntaxError as exc:
        raise BadInputError(
            f"Jinja2 syntax error: {exc.message}", where=f"{where}:{exc.lineno}"
        ) from exc
    except RecursionError as exc:  # a shape the nesting count does not see (e.g. `not not …`)
        raise BadInputError("template nested too deeply to parse", where=f"{where}:1") from exc
    check_tree(tree, where, limits)
    _refuse_escapes(tree, where)
    return tree


def _node_signature(node: nodes.Node) -> str:
    # Names that shape what renders: variables, attributes, filters, tests, blocks, macros.
    # Expression constants count (``role == 'user'`` is logic); literal template text does not.
    if isinstance(node, nodes.Name):
        return f"Name:{node.name}:{node.ctx}"
    if isinstance(node, nodes.Getattr):
        return f"Getattr:{node.attr}"
    if isinstance(node, nodes.Filter | nodes.Test):
        return f"{type(node).__name__}:{node.name}"
    if isinstance(node, nodes.Block | nodes.Macro):
        return f"{type(node).__name__}:{node.name}"
    if isinstance(node, nodes.Const):
        return f"Const:{node.value!r}"
    return type(node).__name__


def _structure_tokens(node: nodes.Node, depth: int = 0) -> Iterator[str]:
    if isinstance(node, nodes.TemplateData):
        return
    yield f"{depth}:{_node_signature(node)}"
    for child in node.iter_child_nodes():
        yield from _structure_tokens(child, depth + 1)


def jinja_structure(tree: nodes.Template) -> str:
    """Structural fingerprint of a parsed template: its node tree without literal text."""
    return _digest("jinja", *_structure_tokens(tree))


def jinja_static_prefix(source: str) -> str:
    """Literal text before the first variable or tag (comments skipped), as it would render."""
    head: list[str] = []
    for _, token_type, value in sandbox().lex(source):
        if token_type in _COMMENT_TOKENS:
            continue
        if token_type != "data":
            break
        head.append(value)
    return "".join(head)


def jinja_template(template_id: str, path: str, kind: TemplateKind, source: str) -> Template:
    """A :class:`Template` from Jinja2 source (parsed in the sandbox, escapes refused)."""
    tree = parse_jinja(source, template_id)
    return Template(
        template_id=template_id,
        path=path,
        kind=kind,
        source=source,
        structure=jinja_structure(tree),
        content=_digest(source),
        static_prefix=jinja_static_prefix(source),
    )


def render(
    template: Template,
    context: Mapping[str, Any],
    files: Mapping[str, str] | None = None,
    *,
    limits: TemplateLimits = DEFAULT_TEMPLATE_LIMITS,
    clock: Clock = time.monotonic,
) -> str:
    """Render a Jinja2 template in the bounded sandbox (:mod:`pipeline.template_sandbox`);
    ``files`` (repository path → source) is all ``include``/``import``/``extends`` can reach.
    Any failure the template causes is a :class:`BadInputError` naming the template and line.
    """
    if template.kind == "python" and not any(m in template.source for m in _JINJA_MARKERS):
        raise BadInputError("not a Jinja2 template (a Python string)", where=template.template_id)
    parse_jinja(template.source, template.template_id, limits)
    return render_bounded(template.source, template.template_id, context, files, limits, clock)


# --- chat templates in tokenizer_config.json ----------------------------------------------------


def _chat_entries(config: object, path: str) -> list[tuple[str, str]]:
    if not isinstance(config, dict):
        raise BadInputError("expected a JSON object", where=path)
    chat = config.get("chat_template")
    if chat is None:
        return []
    if isinstance(chat, str):
        return [("default", chat)]
    if not isinstance(chat, list):
        raise BadInputError(
            "chat_template must be a string or a list", where=f"{path}:chat_template"
        )
    entries = []
    for index, entry in enumerate(chat):
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)):
            raise BadInputError(
                "entry needs a string 'name'", where=f"{path}:chat_template[{index}]"
            )
        if not isinstance(entry.get("template"), str):
            raise BadInputError(
                "entry needs a string 'template'", where=f"{path}:chat_template[{index}]"
            )
        entries.append((entry["name"], entry["template"]))
    return entries


def chat_templates(path: str, text: str) -> list[Template]:
    """Chat templates of ``tokenizer_config.json`` (``path#name``; a plain string: ``default``).

    Size and nesting are checked before ``json.loads`` runs (it recurses on nesting).
    """
    config = load_json(text, path, CONFIG_LIMITS)
    return [
        jinja_template(f"{path}#{name}", path, "chat", source)
        for name, source in _chat_entries(config, path)
    ]


# --- Python prompt modules ----------------------------------------------------------------------


def _fstring_tokens(node: ast.JoinedStr) -> Iterator[str]:
    for part in node.values:
        if isinstance(part, ast.FormattedValue):
            spec = ast.dump(part.format_spec) if part.format_spec else ""
            yield f"Field:{ast.dump(part.value)}:{part.conversion}:{spec}"


def _fstring_head(node: ast.JoinedStr) -> str:
    head = node.values[0] if node.values else None
    if isinstance(head, ast.Constant) and isinstance(head.value, str):
        return head.value
    return ""


def _format_fields(text: str, where: str) -> tuple[list[str], str]:
    """Replacement fields of a ``str.format`` template and its literal head."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError:
        return [], text  # not a format template after all: all literal text
    fields = [f"{name}!{conv}:{spec}" for _, name, spec, conv in parsed if name is not None]
    for field in fields:
        if "._" in field or field.startswith("_") or "[_" in field:
            raise BadInputError(
                f"format field {field!r} reaches for a private attribute", where=where
            )
    head = parsed[0][0] if parsed else ""
    return fields, head if fields else text


def _string_template(template_id: str, path: str, text: str) -> Template:
    if any(marker in text for marker in _JINJA_MARKERS):
        return jinja_template(template_id, path, "python", text)
    fields, head = _format_fields(text, template_id)
    return Template(
        template_id, path, "python", text, _digest("format", *fields), _digest(text), head
    )


def _fstring_template(template_id: str, path: str, node: ast.JoinedStr) -> Template:
    source = ast.unparse(node)
    structure = _digest("fstring", *_fstring_tokens(node))
    return Template(
        template_id, path, "python", source, structure, _digest(source), _fstring_head(node)
    )


def _module_strings(tree: ast.Module) -> Iterator[tuple[str, ast.expr]]:
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            continue
        if isinstance(target, ast.Name) and not target.id.startswith("__"):
            yield target.id, value


def python_templates(path: str, text: str) -> list[Template]:
    """Module-level string and f-string constants of a Python file, read with ``ast`` only."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise BadInputError(
            f"Python syntax error: {exc.msg}", where=f"{path}:{exc.lineno}"
        ) from exc
    except (RecursionError, MemoryError, ValueError) as exc:
        # CPython's parser gives up on very deep nesting with these instead of a SyntaxError.
        raise BadInputError(f"Python source too deeply nested ({exc})", where=f"{path}:1") from exc
    try:
        return _python_module_templates(path, tree)
    except RecursionError as exc:  # ast.unparse of a pathologically deep f-string
        raise BadInputError("f-string nested too deeply", where=f"{path}:1") from exc


def _python_module_templates(path: str, tree: ast.Module) -> list[Template]:
    found = []
    for name, value in _module_strings(tree):
        template_id = f"{path}#{name}"
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            found.append(_string_template(template_id, path, value.value))
        elif isinstance(value, ast.JoinedStr):
            found.append(_fstring_template(template_id, path, value))
    return found


# --- files --------------------------------------------------------------------------------------


def is_template_path(path: str) -> bool:
    """Whether a file at ``path`` can hold templates (by name)."""
    name = posixpath.basename(path)
    return name == TOKENIZER_CONFIG or name.endswith((*JINJA_SUFFIXES, ".py"))


def _decode(path: str, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInputError(f"not UTF-8 text (byte {exc.start})", where=path) from exc


def templates_in_file(
    path: str, data: bytes, limits: TemplateLimits = DEFAULT_TEMPLATE_LIMITS
) -> list[Template]:
    """Every template in one repository file; unknown file kinds hold none.

    A file over ``limits.max_bytes`` is refused before it is decoded or parsed.
    """
    path = repo_relative_path(path)
    name = posixpath.basename(path)
    if not is_template_path(path):
        return []
    if len(data) > limits.max_bytes:
        raise BadInputError(
            f"{len(data)} bytes is over the template size limit of {limits.max_bytes}",
            where=f"{path}:1",
        )
    text = _decode(path, data)
    if name == TOKENIZER_CONFIG:
        return chat_templates(path, text)
    if name.endswith(".py"):
        return python_templates(path, text)
    kind: TemplateKind = "chat" if name == CHAT_TEMPLATE_FILE else "jinja"
    return [jinja_template(path, path, kind, text)]
