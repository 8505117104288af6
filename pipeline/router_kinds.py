"""What prewarm knows of each router kind it drives, by version: where it lists its workers,
which counter of its own Prometheus endpoint says it restarted, its policies, and what its
``cache_aware`` tree is keyed on.

Checked on the versions named, from their behaviour on loopback in front of simulator replicas:

- **vllm-router 0.1.17** lists its workers at ``GET /list_workers`` (``{"urls": [...]}``);
  its requests counter is ``vllm_router_requests_total``; under ``cache_aware`` it renders
  every request to tokens on its workers (``/v1/completions/render``,
  ``/v1/chat/completions/render``), so a chat and the same prompt rendered for
  ``/v1/completions`` meet in its tree.
- **sglang-router 0.3.2** (``sglang-router launch``) answers ``/list_workers`` with 404 and
  lists its workers at ``GET /workers`` (``{"workers": [{"url": ..., "is_healthy": ...}]}``);
  its series are named ``smg_*`` (``smg_router_requests_total``); its ``cache_aware`` tree is
  keyed on the request's *text* — a chat by its messages, a completion by its prompt — so a
  chat template primed as rendered text is routed apart from its chat users: chat primes go
  as chats. Its policies are ``cache_aware``, ``round_robin``, ``random``, ``power_of_two``
  (and ``manual``, which routes on a header prewarm does not send: refused).

A router of a known kind that answers its worker list's route with 404 is of another kind or
version: :class:`RouterApiError`, never an empty fleet.

Worker membership at run time (what the gate edits, :mod:`pipeline.gate`), tried on loopback:

- **vllm-router 0.1.17**: ``POST /add_worker?url=URL`` and ``POST /remove_worker?url=URL``
  (200 once done: it checks the worker's health before it adds it).
- **sglang-router 0.3.2**: ``POST /workers`` with JSON ``{"url": URL}`` (202: queued, listed
  within milliseconds) and ``DELETE /workers/{id}`` with the worker's id (a UUID) from its list
  (202); ``DELETE /workers/{url}`` is 400 ("expected UUID"), ``/add_worker`` and
  ``/remove_worker`` are 404.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.errors import BadInputError


class RouterApiError(BadInputError):
    """The router does not serve the API of the kind it is configured as (wrong kind or an
    unsupported version)."""


def _vllm_router_workers(body: Any) -> list[str]:
    urls = body["urls"]
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise TypeError("'urls' is not a list of URLs")
    return urls


def _sglang_router_workers(body: Any) -> list[str]:
    workers = body["workers"]
    if not isinstance(workers, list):
        raise TypeError("'workers' is not a list")
    urls = [w.get("url") if isinstance(w, dict) else None for w in workers]
    if not all(isinstance(u, str) for u in urls):
        raise TypeError("a worker has no 'url'")
    return [str(u) for u in urls]


def _sglang_router_ids(body: Any) -> dict[str, str]:
    return {
        str(w["url"]).rstrip("/"): str(w["id"])
        for w in body.get("workers", ())
        if isinstance(w, dict) and "url" in w and "id" in w
    }


def _no_ids(body: Any) -> dict[str, str]:
    return {}


@dataclass(frozen=True)
class WorkerEdit:
    """One call that adds or removes a worker: its method and path (``{id}``: the worker's id
    from the worker list), and whether the URL goes as the ``url`` query parameter or as JSON
    ``{"url": ...}`` (``none``: the path names it)."""

    method: str
    path: str
    url_as: str  # "query" | "json" | "none"

    @property
    def by_id(self) -> bool:
        """Whether the path names the worker by its id in the worker list."""
        return "{id}" in self.path


@dataclass(frozen=True)
class RouterKind:
    """One router kind as prewarm drives it."""

    name: str
    versions: str
    workers_path: str
    workers_from: Callable[[Any], list[str]]
    #: the counter of the router's own Prometheus endpoint that goes back when it restarts
    requests_counter: str
    policies: tuple[str, ...]
    #: policies whose memory of where prefixes live is keyed on the request's text (a chat by
    #: its messages): primes of chat prefixes go as chats, as their users send them
    text_keyed: frozenset[str] = frozenset()
    #: how a worker is added to and removed from its list at run time
    add: WorkerEdit = WorkerEdit("POST", "/add_worker", "query")
    remove: WorkerEdit = WorkerEdit("POST", "/remove_worker", "query")
    #: url → id of each worker in the body of its worker list (kinds that remove by id)
    ids_from: Callable[[Any], dict[str, str]] = _no_ids

    def workers(self, body: Any, where: str) -> list[str]:
        """Worker URLs from the body of its worker list, without a trailing ``/``."""
        try:
            urls = self.workers_from(body)
        except (KeyError, TypeError, AttributeError) as exc:
            raise RouterApiError(f"not a {self.name} worker list ({exc})", where=where) from exc
        return sorted({u.rstrip("/") for u in urls})


VLLM_ROUTER_POLICIES = (
    "cache_aware", "kv_aware", "consistent_hash", "round_robin", "power_of_two", "random",
    "sticky_least_loaded",
)  # fmt: skip

ROUTER_KINDS: dict[str, RouterKind] = {
    "vllm-router": RouterKind(
        "vllm-router",
        "0.1.17",
        "/list_workers",
        _vllm_router_workers,
        "vllm_router_requests_total",
        VLLM_ROUTER_POLICIES,
    ),
    "sglang-router": RouterKind(
        "sglang-router",
        "0.3.2",
        "/workers",
        _sglang_router_workers,
        "smg_router_requests_total",
        ("cache_aware", "round_robin", "random", "power_of_two"),
        text_keyed=frozenset({"cache_aware"}),
        add=WorkerEdit("POST", "/workers", "json"),
        remove=WorkerEdit("DELETE", "/workers/{id}", "none"),
        ids_from=_sglang_router_ids,
    ),
}


def router_kind(name: str) -> RouterKind:
    """The kind called ``name``; an unknown one is bad input naming the kinds prewarm drives."""
    try:
        return ROUTER_KINDS[name]
    except KeyError:
        known = ", ".join(f"{k.name} {k.versions}" for k in ROUTER_KINDS.values())
        raise BadInputError(f"unknown router kind {name!r} (drives: {known})") from None


def policy_problem(kind: str, policy: str) -> str | None:
    """Why ``kind`` cannot be driven with ``policy`` (None: it can)."""
    known = router_kind(kind)
    if policy in known.policies:
        return None
    return (
        f"{kind} {known.versions} has no policy {policy!r} prewarm can warm for "
        f"(it drives: {', '.join(known.policies)})"
    )
