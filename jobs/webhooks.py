"""Git push webhooks: GitHub, GitLab and Gitea, signed, de-duplicated, bounded.

Order of checks, each answered with its own status and nothing changed on refusal:

1. body over the size limit → 413 (read in chunks; refused before it is all buffered);
2. missing or wrong signature/token → 401 (constant-time compare against every configured
   secret; no payload byte is parsed before this passes);
3. event we do not handle → 200 ignored; ``ping`` → 200 pong;
4. malformed JSON, JSON nested deeper than 32 levels, ``NaN``/``Infinity``, or missing fields
   → 422 (depth is checked by a linear scan before ``json.loads`` runs);
5. repository not configured → 404; configured, but the secret is another repository's → 403;
6. branch not watched → 200 ignored;
7. delivery seen before → 409 (the delivery id is hashed whole, never cut);
8. otherwise ``prewarm.events.repo_changed`` is queued → 202 with its task id.

Every answer, an unexpected 500 included, is counted in ``prewarm_webhook_deliveries_total``.

Nothing in a payload chooses what is fetched: the payload names a repository, which is looked
up among the configured ones, and only the configured URL is fetched.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import Counter
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from pipeline.errors import BadInputError
from pipeline.limits import TextLimits, load_json
from tasks.adapters.store import Store, store_client
from tasks.adapters.template_repos import claim_delivery, release_delivery
from tasks.repo_tasks import queue_repo_changed
from tasks.settings import Settings, TemplateRepoSettings, current_settings

_SHA = re.compile(r"\A(?:[0-9a-fA-F]{40}|[0-9a-fA-F]{64})\Z")
MAX_BODY_BYTES = 1024 * 1024  # GitHub caps payloads at 25 MB; a push of templates is far smaller
# A push payload nests 4 levels deep (payload > commits > commit > author); 32 is generous and
# keeps json.loads far from Python's recursion limit.
PAYLOAD_LIMITS = TextLimits(max_bytes=25 * 1024 * 1024, max_depth=32)  # size: the body cap rules
log = logging.getLogger(__name__)
Enqueue = Callable[[str, str | None, str | None], str]

DELIVERIES = Counter(
    "prewarm_webhook_deliveries_total",
    "Webhook deliveries by forge and outcome",
    ["forge", "status"],
)


class Refused(Exception):
    """A delivery refused with ``status``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass(frozen=True, slots=True)
class Push:
    """The parts of a push event prewarm uses."""

    names: frozenset[str]
    ref: str
    before: str | None
    after: str | None


# --- forges -------------------------------------------------------------------------------------


def _hmac_hex(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _normal(identity: str) -> str:
    text = identity.strip().lower().rstrip("/")
    return text.removesuffix(".git")


@dataclass(frozen=True)
class Forge:
    """How one forge names its events, deliveries, signatures and repositories.

    ``signature`` is how a delivery proves it knows the secret: ``hmac-prefixed``
    (``sha256=<hex>``, GitHub), ``hmac`` (bare hex, Gitea) or ``token`` (the secret itself in a
    header, GitLab). Every comparison is constant-time.
    """

    name: str
    event_header: str
    delivery_headers: tuple[str, ...]
    push_events: frozenset[str]
    ping_events: frozenset[str]
    repo_field: str
    name_fields: tuple[str, ...]
    signature_header: str
    signature: str

    def _expected(self, secret: str, body: bytes) -> str:
        if self.signature == "token":
            return secret
        digest = _hmac_hex(secret, body)
        return f"sha256={digest}" if self.signature == "hmac-prefixed" else digest

    def signature_ok(self, headers: Any, body: bytes, secret: str) -> bool:
        """Whether the delivery is signed (or carries the token) for ``secret``."""
        given = headers.get(self.signature_header, "").encode()
        return hmac.compare_digest(given, self._expected(secret, body).encode())

    def has_signature(self, headers: Any) -> bool:
        """Whether the signature or token header is present at all."""
        return bool(headers.get(self.signature_header))

    def delivery(self, headers: Any) -> str:
        """The forge's delivery id, hashed whole ('' when it sends none; the body hash stands in).

        Hashed rather than cut: two deliveries that share a long prefix are two deliveries.
        """
        given = next((headers[h] for h in self.delivery_headers if headers.get(h)), "")
        if not given:
            return ""
        return "sha256-" + hashlib.sha256(given.encode("utf-8", "surrogateescape")).hexdigest()

    def push(self, payload: Any) -> Push:
        """The push in ``payload``; missing or mistyped fields are a 422."""
        if not isinstance(payload, dict) or not isinstance(payload.get(self.repo_field), dict):
            raise Refused(422, f"payload has no {self.repo_field!r} object")
        repo = payload[self.repo_field]
        names = frozenset(
            _normal(repo[f]) for f in self.name_fields if isinstance(repo.get(f), str)
        )
        ref, before, after = payload.get("ref"), payload.get("before"), payload.get("after")
        if not names or not isinstance(ref, str):
            raise Refused(422, "payload lacks the repository name or the ref")
        if not all(v is None or (isinstance(v, str) and _SHA.match(v)) for v in (before, after)):
            raise Refused(422, "before/after must be commit shas")
        return Push(names, ref, before, after)


GITHUB = Forge(
    "github", "x-github-event", ("x-github-delivery",), frozenset({"push"}), frozenset({"ping"}),
    "repository", ("full_name", "clone_url", "ssh_url", "html_url", "git_url"),
    "x-hub-signature-256", "hmac-prefixed",
)  # fmt: skip
GITLAB = Forge(
    "gitlab", "x-gitlab-event", ("x-gitlab-event-uuid", "x-gitlab-webhook-uuid"),
    frozenset({"Push Hook"}), frozenset(), "project",
    ("path_with_namespace", "web_url", "git_http_url", "git_ssh_url"),
    "x-gitlab-token", "token",
)  # fmt: skip
GITEA = Forge(
    "gitea", "x-gitea-event", ("x-gitea-delivery",), frozenset({"push"}), frozenset(),
    "repository", ("full_name", "clone_url", "ssh_url", "html_url"),
    "x-gitea-signature", "hmac",
)  # fmt: skip


# --- the receiver -------------------------------------------------------------------------------


async def read_bounded(request: Request, limit: int) -> bytes:
    """The request body, refusing with 413 as soon as it exceeds ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Refused(413, f"body of {declared} bytes is over the {limit}-byte limit")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Refused(413, f"body is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def _payload(request: Request, body: bytes) -> Any:
    """The signed JSON document; depth, odd constants and bad encodings are a 422."""
    try:
        if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            # GitHub's form content type: the JSON document in a ``payload`` field.
            text: bytes | str = parse_qs(body.decode(), max_num_fields=16)["payload"][0]
        else:
            text = body
        return load_json(text, "payload", PAYLOAD_LIMITS)
    except (BadInputError, ValueError, KeyError, UnicodeDecodeError) as exc:
        raise Refused(422, f"payload is not usable JSON: {exc}") from exc


def _identities(repo: TemplateRepoSettings) -> set[str]:
    return {_normal(repo.name), _normal(repo.url)}


class WebhookReceiver:
    """Checks deliveries against the configured repositories and queues re-warms."""

    def __init__(self, settings: Settings, store: Store, enqueue: Enqueue, max_body: int) -> None:
        self.repos = settings.template_repos
        self.store, self.enqueue, self.max_body = store, enqueue, max_body

    def _signed_for(self, forge: Forge, headers: Any, body: bytes) -> list[TemplateRepoSettings]:
        if not forge.has_signature(headers):
            raise Refused(401, "missing signature")
        signed = [
            repo for repo in self.repos
            if repo.webhook_secret is not None
            and forge.signature_ok(headers, body, repo.webhook_secret.get_secret_value())
        ]  # fmt: skip
        if not signed:
            raise Refused(401, "bad signature")
        return signed

    def _configured(
        self, push: Push, signed: Iterable[TemplateRepoSettings]
    ) -> TemplateRepoSettings:
        known = [repo for repo in self.repos if _identities(repo) & push.names]
        if not known:
            raise Refused(404, "repository is not configured")
        allowed = [repo for repo in known if repo in signed]
        if not allowed:
            raise Refused(403, "signed with another repository's secret")
        return allowed[0]

    async def receive(self, forge: Forge, request: Request) -> tuple[int, dict[str, Any]]:
        """Handle one delivery; returns (status, JSON body)."""
        body = await read_bounded(request, self.max_body)
        signed = self._signed_for(forge, request.headers, body)
        event = request.headers.get(forge.event_header, "")
        if event in forge.ping_events:
            return 200, {"status": "pong"}
        if event not in forge.push_events:
            return 200, {"status": "ignored", "reason": f"event {event!r} not handled"}
        push = forge.push(_payload(request, body))
        repo = self._configured(push, signed)
        if push.ref != f"refs/heads/{repo.branch}":
            return 200, {"status": "ignored", "reason": f"{push.ref} is not watched"}
        task_id = await run_in_threadpool(self._queue, forge, request.headers, body, repo, push)
        return 202, {"status": "accepted", "repo": repo.name, "task_id": task_id}

    def _queue(
        self, forge: Forge, headers: Any, body: bytes, repo: TemplateRepoSettings, push: Push
    ) -> str:
        delivery = forge.delivery(headers)
        if not claim_delivery(self.store, forge.name, delivery, body):
            raise Refused(409, "delivery already received")
        try:
            return self.enqueue(repo.name, push.before, push.after)
        except Exception:
            release_delivery(self.store, forge.name, delivery, body)
            raise


def _endpoint(receiver: Callable[[], WebhookReceiver], forge: Forge) -> Callable[..., Any]:
    async def handle(request: Request) -> JSONResponse:
        try:
            status, body = await receiver().receive(forge, request)
        except Refused as refused:
            status, body = refused.status, {"status": "refused", "reason": refused.reason}
        except Exception:
            # Whatever went wrong, the delivery is counted and answered, never dropped silently.
            log.exception("webhook delivery from %s failed", forge.name)
            status, body = 500, {"status": "error", "reason": "internal error"}
        DELIVERIES.labels(forge.name, str(status)).inc()
        return JSONResponse(body, status_code=status)

    return handle


def webhook_routes(
    settings: Settings | None = None,
    store: Store | None = None,
    enqueue: Enqueue | None = None,
    max_body: int = MAX_BODY_BYTES,
) -> list[Route]:
    """The three webhook routes; settings and the store are resolved on the first delivery."""
    built: list[WebhookReceiver] = []

    def receiver() -> WebhookReceiver:
        if not built:
            resolved = settings or current_settings()
            built.append(
                WebhookReceiver(
                    resolved,
                    store or store_client(resolved),
                    enqueue or queue_repo_changed,
                    max_body,
                )
            )
        return built[0]

    return [
        Route(f"/webhooks/{forge.name}", _endpoint(receiver, forge), methods=["POST"])
        for forge in (GITHUB, GITLAB, GITEA)
    ]


def webhook_app(**options: Any) -> Starlette:
    """A Starlette app with only the webhook routes (mountable, or served on its own)."""
    return Starlette(routes=webhook_routes(**options))
