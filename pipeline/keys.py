"""The versioned cache key scheme, and the JSON encoding of cached values.

A key names everything that decides a cached value: the scheme version, the tenant (its own
namespace), the kind of entry, the model id, the template id and version (or the hash of the
system prompt when no template is known), the hash of the sampling parameters and the hash of
the content. A new template version, model or parameter set gives a new key, so a stale entry
can never be served. Values are JSON text — never pickle.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.errors import BadInputError

KEY_SCHEME_VERSION = 1
ROOT = "pw"
_SEP = ":"


def stable_hash(payload: str | bytes, size: int = 8) -> str:
    """Short, stable hex digest (blake2b) of ``payload``."""
    data = payload.encode() if isinstance(payload, str) else payload
    return hashlib.blake2b(data, digest_size=size).hexdigest()


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal values give equal text."""
    return _CANONICAL.encode(value)


def params_hash(params: Mapping[str, Any]) -> str:
    """Hash of sampling parameters; ``None`` values are dropped so absent == unset."""
    return stable_hash(canonical_json({k: v for k, v in params.items() if v is not None}))


def content_hash(
    text: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None
) -> str:
    """Hash of a prompt: its text, or its chat messages (role and content, in order)."""
    if messages is not None:
        return stable_hash("m" + canonical_json([dict(m) for m in messages]))
    if text is None:
        raise BadInputError("a prompt needs text or messages", where="content")
    return stable_hash("t" + text)


def system_prompt_hash(system_prompt: str) -> str:
    """Stand-in for a template version where only the system prompt is known."""
    return "sp-" + stable_hash(system_prompt)


def _clean(part: str, field: str) -> str:
    if not part or _SEP in part or any(c.isspace() for c in part):
        raise BadInputError(f"{part!r} may not be empty or hold ':' or spaces", where=field)
    return part


def safe_part(value: str) -> str:
    """A model or tenant name made usable inside a key (':' and spaces replaced)."""
    cleaned = "".join("_" if c == _SEP or c.isspace() else c for c in value)
    return cleaned or "_"


@dataclass(frozen=True, slots=True)
class CacheKey:
    """Every part that decides a cached value; :meth:`render` gives the Redis key."""

    kind: str
    model: str
    template: str
    params: str
    content: str
    tenant: str = "default"
    version: int = KEY_SCHEME_VERSION

    def render(self) -> str:
        """``pw:v1:t:<tenant>:<kind>:<model>:<template>:<params>:<content>``."""
        parts = [
            _clean(safe_part(self.tenant), "tenant"),
            _clean(self.kind, "kind"),
            _clean(safe_part(self.model), "model"),
            _clean(safe_part(self.template), "template"),
            _clean(self.params, "params"),
            _clean(self.content, "content"),
        ]
        return _SEP.join([ROOT, f"v{self.version}", "t", *parts])

    @classmethod
    def parse(cls, key: str) -> CacheKey:
        """Inverse of :meth:`render`; a foreign or older-scheme key is bad input."""
        parts = key.split(_SEP)
        if len(parts) != 9 or parts[0] != ROOT or parts[2] != "t" or not parts[1].startswith("v"):
            raise BadInputError(f"not a prewarm cache key: {key!r}", where="key")
        tenant, kind, model, template, params, content = parts[3:]
        return cls(kind, model, template, params, content, tenant, int(parts[1][1:]))


def tenant_namespace(tenant: str, version: int = KEY_SCHEME_VERSION) -> str:
    """Key prefix of everything cached for ``tenant`` (for scans and per-tenant flushes)."""
    return _SEP.join([ROOT, f"v{version}", "t", safe_part(tenant), ""])


def response_key(
    *,
    model: str,
    template: str,
    params: Mapping[str, Any],
    text: str | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
    tenant: str = "default",
    kind: str = "response",
) -> CacheKey:
    """Key of a cached response (or embedding, with ``kind='embedding'``) for one prompt."""
    return CacheKey(
        kind=kind,
        model=model,
        template=template,
        params=params_hash(params),
        content=content_hash(text, messages),
        tenant=tenant,
    )


def adapter_key(name: str) -> str:
    """Key of a LoRA adapter item (a plan is per engine, so the name alone is its identity)."""
    return f"adapter:{name}"


def shape_key(profile: str) -> str:
    """Key of a workload-shape item (``p<prompt bucket>-o<output bucket>``)."""
    return f"shape:{profile}"


def template_head_key(
    model: str, tag: str, text: str, *, chat: bool = False, tenant: str = "default"
) -> str:
    """Key of a template head's prefix item: versioned by the template's tag, and by the
    endpoint it is primed through (a chat rendering is other tokens than the plain text)."""
    messages = [{"role": "system", "content": text}] if chat else None
    content = content_hash(None if chat else text, messages)
    return CacheKey("prefix", model, tag, params_hash({}), content, tenant).render()


def encode_value(value: Mapping[str, Any]) -> str:
    """JSON text of a cached value."""
    return canonical_json(dict(value))


def decode_value(raw: str | bytes | None) -> dict[str, Any] | None:
    """Parse a cached value; ``None`` when absent. Non-JSON content is a consistency problem."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInputError("cached value is not JSON", where="cache value") from exc
    if not isinstance(value, dict):
        raise BadInputError("cached value is not a JSON object", where="cache value")
    return value
