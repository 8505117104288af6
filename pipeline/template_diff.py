"""Template changes between two commits, the smallest re-warm set, and templates meeting traffic.

Input is what git says changed (paths, with renames detected by git) and the templates read from
the old and new blobs of those paths; output is one :class:`TemplateChange` per template that is
not identical, and a :class:`RewarmSet` that names exactly the versions to warm and to retire.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache

from pipeline.errors import BadInputError
from pipeline.keys import CacheKey, content_hash, params_hash
from pipeline.planner.plan import WarmItem
from pipeline.prefix_blocks import DEFAULT_BLOCK_SIZE, count_tokens
from pipeline.templates import Template, repo_relative_path, templates_in_file


class ChangeKind(StrEnum):
    """How a template changed between two commits."""

    ADDED = "added"
    REMOVED = "removed"
    RENAMED = "renamed"
    TEXT_ONLY = "text-only"
    STRUCTURAL = "structural"


@dataclass(frozen=True, slots=True)
class FileChange:
    """One path git reports as changed: status ``A``, ``D``, ``M`` or ``R`` (``old_path`` set)."""

    status: str
    path: str
    old_path: str | None = None


@dataclass(frozen=True, slots=True)
class TemplateChange:
    """One template's change. A rename may also edit the text (``edit`` says how, else None)."""

    kind: ChangeKind
    old: Template | None
    new: Template | None
    edit: ChangeKind | None = None

    @property
    def template_id(self) -> str:
        """The id after the change (before it, for a removal)."""
        current = self.new or self.old
        assert current is not None
        return current.template_id


@dataclass(frozen=True, slots=True)
class Reject:
    """A template file that could not be read; its previous version keeps serving."""

    path: str
    reason: str


@dataclass(frozen=True)
class RewarmSet:
    """Versions to warm (new) and to retire (old), hottest first."""

    warm: tuple[Template, ...]
    retire: tuple[Template, ...]
    changes: tuple[TemplateChange, ...]
    rejects: tuple[Reject, ...] = field(default=())

    def summary(self) -> dict[str, object]:
        """A small JSON-able view for task results and logs."""
        kinds = Counter(str(change.kind) for change in self.changes)
        return {
            "warm": [t.template_id for t in self.warm],
            "retire": [t.template_id for t in self.retire],
            "changes": dict(kinds),
            "rejects": [{"path": r.path, "reason": r.reason} for r in self.rejects],
        }


# --- file patterns ------------------------------------------------------------------------------


@lru_cache(maxsize=256)
def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out, index = [], 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            out.append("(?:.*/)?")
            index += 3
        elif pattern.startswith("**", index):
            out.append(".*")
            index += 2
        elif pattern[index] == "*":
            out.append("[^/]*")
            index += 1
        elif pattern[index] == "?":
            out.append("[^/]")
            index += 1
        else:
            out.append(re.escape(pattern[index]))
            index += 1
    return re.compile("".join(out) + r"\Z")


def check_patterns(patterns: Sequence[str]) -> tuple[str, ...]:
    """Configured file patterns, refusing any that would reach outside the repository."""
    for pattern in patterns:
        repo_relative_path(pattern)
    return tuple(patterns)


def matches(path: str, patterns: Sequence[str]) -> bool:
    """Whether a repository path matches one of the glob ``patterns`` (``**`` spans folders)."""
    return any(_pattern_regex(pattern).match(path) for pattern in patterns)


# --- reading templates --------------------------------------------------------------------------


def read_templates(
    files: Mapping[str, bytes], rejects: list[Reject] | None = None
) -> dict[str, Template]:
    """Templates of several files by id; unreadable files are appended to ``rejects`` if given."""
    found: dict[str, Template] = {}
    for path, data in files.items():
        try:
            for template in templates_in_file(path, data):
                found[template.template_id] = template
        except BadInputError as exc:
            if rejects is None:
                raise
            rejects.append(Reject(path, str(exc)))
    return found


# --- classification -----------------------------------------------------------------------------


def _edit_kind(old: Template, new: Template) -> ChangeKind | None:
    if old.content == new.content:
        return None
    return ChangeKind.TEXT_ONLY if old.structure == new.structure else ChangeKind.STRUCTURAL


def _renamed_id(template_id: str, renames: Mapping[str, str]) -> str:
    path, sep, name = template_id.partition("#")
    return renames.get(path, path) + sep + name


def classify(
    old: Mapping[str, Template], new: Mapping[str, Template], renames: Mapping[str, str]
) -> list[TemplateChange]:
    """Every template that differs between ``old`` and ``new`` (by id), with how it changed.

    ``renames`` maps old file paths to new ones, as git's rename detection reported them.
    """
    changes: list[TemplateChange] = []
    claimed: set[str] = set()
    for old_id, before in sorted(old.items()):
        new_id = _renamed_id(old_id, renames)
        after = new.get(new_id)
        if after is None:
            changes.append(TemplateChange(ChangeKind.REMOVED, before, None))
            continue
        claimed.add(new_id)
        edit = _edit_kind(before, after)
        if new_id != old_id:
            changes.append(TemplateChange(ChangeKind.RENAMED, before, after, edit))
        elif edit is not None:
            changes.append(TemplateChange(edit, before, after))
    for new_id, after in sorted(new.items()):
        if new_id not in claimed:
            changes.append(TemplateChange(ChangeKind.ADDED, None, after))
    return changes


def renames_of(files: Iterable[FileChange]) -> dict[str, str]:
    """Old path → new path for every rename in a git diff."""
    return {f.old_path: f.path for f in files if f.status == "R" and f.old_path}


# --- traffic ------------------------------------------------------------------------------------


class PrefixMatcher:
    """Finds, for a prompt, the template with the longest static prefix it starts with."""

    def __init__(self, templates: Iterable[Template], min_chars: int = 8) -> None:
        self.min_chars = min_chars
        self._by_length: dict[int, dict[str, str]] = {}
        for template in templates:
            prefix = template.static_prefix
            if len(prefix) >= min_chars:
                self._by_length.setdefault(len(prefix), {})[prefix] = template.template_id
        self._lengths = sorted(self._by_length, reverse=True)

    def match(self, prompt: str) -> str | None:
        """The id of the best matching template, or None when no static prefix fits."""
        for length in self._lengths:
            if length <= len(prompt):
                found = self._by_length[length].get(prompt[:length])
                if found is not None:
                    return found
        return None


def template_hotness(prompts: Iterable[object], templates: Iterable[Template]) -> Counter[str]:
    """Requests per template id, matching each prompt by longest static prefix; gaps skipped."""
    matcher = PrefixMatcher(templates)
    counts: Counter[str] = Counter()
    for prompt in prompts:
        if isinstance(prompt, str):
            found = matcher.match(prompt)
            if found is not None:
                counts[found] += 1
    return counts


# --- the re-warm set ----------------------------------------------------------------------------

_WARMS = {ChangeKind.ADDED, ChangeKind.TEXT_ONLY, ChangeKind.STRUCTURAL, ChangeKind.RENAMED}
_RETIRES = {ChangeKind.REMOVED, ChangeKind.TEXT_ONLY, ChangeKind.STRUCTURAL, ChangeKind.RENAMED}


def _hotness_of(template: Template, hotness: Mapping[str, int]) -> int:
    return int(hotness.get(template.template_id, 0))


def rewarm_set(
    changes: Sequence[TemplateChange],
    hotness: Mapping[str, int] | None = None,
    rejects: Sequence[Reject] = (),
) -> RewarmSet:
    """The smallest re-warm: new versions of changed templates, hottest first, and what retires.

    Hotness of a renamed or edited template is read under its old id as well, since the traffic
    seen so far was served by the old version.
    """
    hotness = hotness or {}
    warm = [c.new for c in changes if c.kind in _WARMS and c.new is not None]
    retire = [c.old for c in changes if c.kind in _RETIRES and c.old is not None]
    old_heat = {c.new.template_id: _hotness_of(c.old, hotness) for c in changes if c.old and c.new}

    def heat(template: Template) -> int:
        return max(_hotness_of(template, hotness), old_heat.get(template.template_id, 0))

    warm.sort(key=lambda t: (-heat(t), t.template_id))
    return RewarmSet(tuple(warm), tuple(retire), tuple(changes), tuple(rejects))


# --- warm items ---------------------------------------------------------------------------------


def version_tag(template: Template) -> str:
    """``<template id>@<version>``: what a cache key carries as its template part."""
    return f"{template.template_id}@{template.version}"


def rewarm_items(
    rewarm: RewarmSet,
    model: str,
    hotness: Mapping[str, int] | None = None,
    tenant: str = "default",
    min_tokens: int = DEFAULT_BLOCK_SIZE,
) -> list[WarmItem]:
    """Prefix items for the new versions (hottest first).

    A head shorter than one cache block (``min_tokens``) gives an engine nothing to cache ahead
    of the request — it caches whole blocks only — so such templates carry no item.
    """
    hotness = hotness or {}
    items = []
    for template in rewarm.warm:
        if count_tokens(template.static_prefix) < min_tokens:
            continue
        tag = version_tag(template)
        key = CacheKey("prefix", model, tag, params_hash({}), content_hash(template.static_prefix))
        items.append(
            WarmItem(
                kind="prefix",
                key=key.render(),
                model=model,
                text=template.static_prefix,
                tenant=tenant,
                tokens=count_tokens(template.static_prefix),
                predicted_hits=float(hotness.get(template.template_id, 0)),
                template=tag,
            )
        )
    return items
