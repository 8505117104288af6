"""Webhook deliveries over real HTTP, shaped as GitHub, GitLab and Gitea send them."""
# ruff: noqa: E501  (payloads kept in the forges' own one-object-per-line shapes)

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

from jobs.embedded import serve_app
from jobs.webhooks import webhook_app
from tasks.adapters.broker_queues import queue_keys
from tasks.repo_tasks import queue_repo_changed
from tasks.settings import Settings, TemplateRepoSettings

pytestmark = pytest.mark.integration

SECRET = "It's a Secret to Everybody"
OTHER_SECRET = "another repository's secret"
BEFORE = "6113728f27ae82c7b1a177c8d03f9e96e0adf246"
AFTER = "59b20b8d5c6ff8d09518454d4dd8b7b30f095ab5"
MAX_BODY = 64 * 1024


def github_push(full_name: str = "acme/prompts", ref: str = "refs/heads/main") -> dict:
    """A push event as GitHub sends it (abridged to the fields GitHub always includes)."""
    owner, name = full_name.split("/")
    return {
        "ref": ref, "before": BEFORE, "after": AFTER, "created": False, "deleted": False,
        "forced": False, "base_ref": None, "compare": f"https://github.com/{full_name}/compare/6113728f27ae...59b20b8d5c6f",
        "commits": [{
            "id": AFTER, "tree_id": "f9d2a07e9488b91af2641b26b9407fe22a451433", "distinct": True,
            "message": "Shorter support prompt", "timestamp": "2024-05-02T10:31:06+02:00",
            "url": f"https://github.com/{full_name}/commit/{AFTER}",
            "author": {"name": "Ada", "email": "ada@example.com", "username": "ada"},
            "committer": {"name": "Ada", "email": "ada@example.com", "username": "ada"},
            "added": [], "removed": [], "modified": ["prompts/support.jinja"],
        }],
        "head_commit": None,
        "repository": {
            "id": 186853002, "node_id": "MDEwOlJlcG9zaXRvcnkxODY4NTMwMDI=", "name": name,
            "full_name": full_name, "private": False,
            "owner": {"name": owner, "login": owner, "id": 21031067, "type": "Organization"},
            "html_url": f"https://github.com/{full_name}", "url": f"https://github.com/{full_name}",
            "git_url": f"git://github.com/{full_name}.git", "ssh_url": f"git@github.com:{full_name}.git",
            "clone_url": f"https://github.com/{full_name}.git", "default_branch": "main",
            "master_branch": "main", "pushed_at": 1557933657,
        },
        "pusher": {"name": "ada", "email": "ada@example.com"},
        "sender": {"login": "ada", "id": 21031067, "type": "User"},
    }  # fmt: skip


def github_ping() -> dict:
    return {
        "zen": "Keep it logically awesome.", "hook_id": 109948940,
        "hook": {"type": "Repository", "id": 109948940, "name": "web", "active": True,
                 "events": ["push"], "config": {"content_type": "json", "insecure_ssl": "0",
                 "url": "https://prewarm.example.com/webhooks/github"}},
        "repository": github_push()["repository"], "sender": {"login": "ada", "id": 21031067},
    }  # fmt: skip


def gitlab_push(path: str = "acme/prompts") -> dict:
    """A ``Push Hook`` as GitLab sends it."""
    return {
        "object_kind": "push", "event_name": "push", "before": BEFORE, "after": AFTER,
        "ref": "refs/heads/main", "ref_protected": True, "checkout_sha": AFTER, "message": None,
        "user_id": 4, "user_name": "Ada Lovelace", "user_username": "ada", "user_email": "",
        "user_avatar": "https://s.gravatar.com/avatar/d4c74594d841139328695756648b6bd6?s=8://s.gravatar.com/avatar/d4c74594d841139328695756648b6bd6?s=80",
        "project_id": 15,
        "project": {
            "id": 15, "name": path.split("/")[1], "description": "Prompt templates",
            "web_url": f"http://gitlab.example.com/{path}", "avatar_url": None,
            "git_ssh_url": f"git@gitlab.example.com:{path}.git",
            "git_http_url": f"http://gitlab.example.com/{path}.git", "namespace": path.split("/")[0],
            "visibility_level": 0, "path_with_namespace": path, "default_branch": "main",
            "homepage": f"http://gitlab.example.com/{path}", "url": f"git@gitlab.example.com:{path}.git",
            "ssh_url": f"git@gitlab.example.com:{path}.git", "http_url": f"http://gitlab.example.com/{path}.git",
        },
        "commits": [{"id": AFTER, "message": "Shorter support prompt\n", "title": "Shorter support prompt",
                     "timestamp": "2024-05-02T10:31:06+02:00", "url": f"http://gitlab.example.com/{path}/-/commit/{AFTER}",
                     "author": {"name": "Ada", "email": "ada@example.com"},
                     "added": [], "modified": ["prompts/support.jinja"], "removed": []}],
        "total_commits_count": 1,
        "repository": {"name": path.split("/")[1], "url": f"git@gitlab.example.com:{path}.git",
                       "description": "Prompt templates", "homepage": f"http://gitlab.example.com/{path}",
                       "git_http_url": f"http://gitlab.example.com/{path}.git",
                       "git_ssh_url": f"git@gitlab.example.com:{path}.git", "visibility_level": 0},
    }  # fmt: skip


def gitea_push(full_name: str = "acme/prompts") -> dict:
    """A push event as Gitea sends it."""
    return {
        "ref": "refs/heads/main", "before": BEFORE, "after": AFTER,
        "compare_url": f"https://gitea.example.com/{full_name}/compare/{BEFORE}...{AFTER}",
        "commits": [{"id": AFTER, "message": "Shorter support prompt\n",
                     "url": f"https://gitea.example.com/{full_name}/commit/{AFTER}",
                     "author": {"name": "Ada", "email": "ada@example.com", "username": "ada"},
                     "committer": {"name": "Ada", "email": "ada@example.com", "username": "ada"},
                     "verification": None, "timestamp": "2024-05-02T10:31:06+02:00",
                     "added": [], "removed": [], "modified": ["prompts/support.jinja"]}],
        "total_commits": 1, "head_commit": None,
        "repository": {"id": 1, "owner": {"id": 1, "login": "acme", "username": "acme"},
                       "name": full_name.split("/")[1], "full_name": full_name, "private": False,
                       "html_url": f"https://gitea.example.com/{full_name}",
                       "ssh_url": f"git@gitea.example.com:{full_name}.git",
                       "clone_url": f"https://gitea.example.com/{full_name}.git",
                       "default_branch": "main"},
        "pusher": {"id": 1, "login": "ada", "username": "ada"}, "sender": {"id": 1, "login": "ada"},
    }  # fmt: skip


def _sig(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github_headers(body: bytes, secret: str = SECRET, event: str = "push") -> dict:
    delivery = str(uuid.uuid4())
    return {
        "Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/044aadd",
        "X-GitHub-Event": event, "X-GitHub-Delivery": delivery,
        "X-GitHub-Hook-ID": "109948940", "X-GitHub-Hook-Installation-Target-Type": "repository",
        "X-Hub-Signature": "sha1=" + hmac.new(secret.encode(), body, hashlib.sha1).hexdigest(),
        "X-Hub-Signature-256": "sha256=" + _sig(secret, body),
    }  # fmt: skip


def gitlab_headers(secret: str = SECRET) -> dict:
    return {
        "Content-Type": "application/json", "User-Agent": "GitLab/16.11.0",
        "X-Gitlab-Event": "Push Hook", "X-Gitlab-Token": secret,
        "X-Gitlab-Event-UUID": str(uuid.uuid4()), "X-Gitlab-Webhook-UUID": str(uuid.uuid4()),
        "X-Gitlab-Instance": "http://gitlab.example.com",
    }  # fmt: skip


def gitea_headers(body: bytes, secret: str = SECRET) -> dict:
    delivery = str(uuid.uuid4())
    signature = _sig(secret, body)
    return {
        "Content-Type": "application/json", "User-Agent": "Go-http-client/1.1",
        "X-Gitea-Delivery": delivery, "X-Gitea-Event": "push", "X-Gitea-Event-Type": "push",
        "X-Gitea-Signature": signature, "X-Gogs-Delivery": delivery, "X-Gogs-Event": "push",
        "X-Gogs-Signature": signature, "X-GitHub-Delivery": delivery, "X-GitHub-Event": "push",
        "X-Hub-Signature-256": "sha256=" + signature,
    }  # fmt: skip


class Receiver:
    """The webhook app on real HTTP, queuing into a queue of its own on the real broker."""

    def __init__(self, url: str, broker: redis.Redis, store: redis.Redis, queue: str) -> None:
        self.url, self.broker, self.store, self.queue = url, broker, store, queue

    def post(self, forge: str, body: bytes, headers: dict) -> httpx.Response:
        return httpx.post(f"{self.url}/webhooks/{forge}", content=body, headers=headers, timeout=10)

    def queued(self) -> int:
        return sum(int(self.broker.llen(key)) for key in queue_keys(self.queue))

    def state(self) -> tuple[int, list[bytes]]:
        """Everything a delivery could change: queued tasks and de-duplication keys."""
        return self.queued(), sorted(self.store.keys("pw:webhooks:*"))


def _settings() -> Settings:
    return Settings(
        template_repos=(
            TemplateRepoSettings(
                name="acme/prompts", url="/nonexistent/acme-prompts", webhook_secret=SECRET
            ),
            TemplateRepoSettings(
                name="acme/other", url="/nonexistent/other", webhook_secret=OTHER_SECRET
            ),
            TemplateRepoSettings(name="acme/nohooks", url="/nonexistent/nohooks"),
        )
    )


def _receiver(broker_url: str, store_url: str, max_body: int) -> Iterator[Receiver]:
    queue = f"webhook-test-{uuid.uuid4().hex[:8]}"
    store = redis.Redis.from_url(store_url)

    def enqueue(repo: str, before: str | None, after: str | None) -> str:
        return queue_repo_changed(repo, before, after, queue=queue)

    app = webhook_app(settings=_settings(), store=store, enqueue=enqueue, max_body=max_body)
    broker = redis.Redis.from_url(broker_url)
    with serve_app(app) as url:
        yield Receiver(url, broker, store, queue)
    broker.delete(queue)


@pytest.fixture
def receiver(celery_app_configured, broker_url, store_url) -> Iterator[Receiver]:
    yield from _receiver(broker_url, store_url, MAX_BODY)


@pytest.fixture
def full_receiver(celery_app_configured, broker_url, store_url) -> Iterator[Receiver]:
    """With the production body limit (1 MiB), as ``prewarm api`` serves it."""
    from jobs.webhooks import MAX_BODY_BYTES

    yield from _receiver(broker_url, store_url, MAX_BODY_BYTES)


def _task_args(receiver: Receiver) -> list:
    (raw,) = [m for key in queue_keys(receiver.queue) for m in receiver.broker.lrange(key, 0, -1)]
    message = json.loads(raw)
    assert message["headers"]["task"] == "prewarm.events.repo_changed"
    return message["headers"]["argsrepr"]


def test_github_push_is_accepted_with_the_task_id(receiver):
    body = json.dumps(github_push()).encode()
    response = receiver.post("github", body, github_headers(body))
    assert response.status_code == 202, response.text
    assert response.json()["task_id"] and response.json()["repo"] == "acme/prompts"
    assert receiver.queued() == 1
    assert BEFORE in _task_args(receiver) and AFTER in _task_args(receiver)


def test_github_form_encoded_push_is_accepted(receiver):
    from urllib.parse import urlencode

    body = urlencode({"payload": json.dumps(github_push())}).encode()
    headers = github_headers(body) | {"Content-Type": "application/x-www-form-urlencoded"}
    assert receiver.post("github", body, headers).status_code == 202


def test_github_ping_is_answered_and_queues_nothing(receiver):
    body = json.dumps(github_ping()).encode()
    response = receiver.post("github", body, github_headers(body, event="ping"))
    assert response.status_code == 200 and response.json()["status"] == "pong"
    assert receiver.queued() == 0


def test_gitlab_push_hook_is_accepted(receiver):
    body = json.dumps(gitlab_push()).encode()
    response = receiver.post("gitlab", body, gitlab_headers())
    assert response.status_code == 202, response.text
    assert receiver.queued() == 1


def test_gitea_push_is_accepted(receiver):
    body = json.dumps(gitea_push()).encode()
    response = receiver.post("gitea", body, gitea_headers(body))
    assert response.status_code == 202, response.text
    assert receiver.queued() == 1


@pytest.mark.parametrize(
    ("forge", "make"),
    [
        ("github", lambda b: github_headers(b, secret="wrong")),
        (
            "github",
            lambda b: {k: v for k, v in github_headers(b).items() if k != "X-Hub-Signature-256"},
        ),
        ("gitlab", lambda b: gitlab_headers(secret="wrong")),
        ("gitea", lambda b: gitea_headers(b, secret="wrong")),
    ],
)
def test_bad_or_missing_signature_is_401_and_changes_nothing(receiver, forge, make):
    payload = {"github": github_push, "gitlab": gitlab_push, "gitea": gitea_push}[forge]()
    body = json.dumps(payload).encode()
    before = receiver.state()
    assert receiver.post(forge, body, make(body)).status_code == 401
    assert receiver.state() == before


def test_tampered_body_is_401(receiver):
    body = json.dumps(github_push()).encode()
    headers = github_headers(body)
    tampered = body.replace(AFTER.encode(), b"0" * 40)
    assert receiver.post("github", tampered, headers).status_code == 401
    assert receiver.queued() == 0


@pytest.mark.parametrize("forge", ["github", "gitea"])
def test_replayed_delivery_is_409_and_changes_nothing(receiver, forge):
    body = json.dumps(github_push() if forge == "github" else gitea_push()).encode()
    headers = github_headers(body) if forge == "github" else gitea_headers(body)
    assert receiver.post(forge, body, headers).status_code == 202
    state = receiver.state()
    replay = receiver.post(forge, body, headers)
    assert replay.status_code == 409
    assert receiver.state() == state


def test_gitlab_delivery_without_uuid_is_deduplicated_by_body(receiver):
    body = json.dumps(gitlab_push()).encode()
    headers = {k: v for k, v in gitlab_headers().items() if not k.endswith("UUID")}
    assert receiver.post("gitlab", body, headers).status_code == 202
    assert receiver.post("gitlab", body, headers).status_code == 409
    assert receiver.queued() == 1


@pytest.mark.parametrize(
    ("forge", "payload", "headers"),
    [
        ("github", github_push("evil/unknown"), None),
        ("gitlab", gitlab_push("evil/unknown"), None),
        ("gitea", gitea_push("evil/unknown"), None),
    ],
)
def test_unknown_repository_is_404_and_changes_nothing(receiver, forge, payload, headers):
    body = json.dumps(payload).encode()
    made = {
        "github": lambda: github_headers(body),
        "gitlab": gitlab_headers,
        "gitea": lambda: gitea_headers(body),
    }
    before = receiver.state()
    assert receiver.post(forge, body, made[forge]()).status_code == 404
    assert receiver.state() == before


def test_another_repositorys_secret_is_403(receiver):
    body = json.dumps(github_push("acme/prompts")).encode()
    before = receiver.state()
    assert (
        receiver.post("github", body, github_headers(body, secret=OTHER_SECRET)).status_code == 403
    )
    assert receiver.state() == before


def test_payload_url_never_chooses_what_is_fetched(receiver):
    # A payload naming a configured repository with a different clone URL still queues only the
    # repository's name; the worker fetches the configured URL.
    payload = github_push()
    payload["repository"]["clone_url"] = "https://attacker.example.com/x.git"
    body = json.dumps(payload).encode()
    assert receiver.post("github", body, github_headers(body)).status_code == 202
    assert "attacker" not in _task_args(receiver)


def test_oversized_body_is_413_and_changes_nothing(receiver):
    payload = github_push()
    payload["commits"] = payload["commits"] * 2000
    body = json.dumps(payload).encode()
    assert len(body) > MAX_BODY
    before = receiver.state()
    assert receiver.post("github", body, github_headers(body)).status_code == 413
    assert receiver.state() == before


def test_oversized_chunked_body_without_length_is_413(receiver):
    body = b"x" * (MAX_BODY + 1)

    def chunks():
        for start in range(0, len(body), 4096):
            yield body[start : start + 4096]

    headers = github_headers(body)
    response = httpx.post(
        f"{receiver.url}/webhooks/github", content=chunks(), headers=headers, timeout=10
    )
    assert response.status_code == 413
    assert receiver.queued() == 0


@pytest.mark.parametrize(
    "body", [b"{not json", b"[1, 2]", json.dumps({"ref": "refs/heads/main"}).encode()]
)
def test_malformed_signed_payload_is_422(receiver, body):
    assert receiver.post("github", body, github_headers(body)).status_code == 422
    assert receiver.queued() == 0


def test_unwatched_branch_is_ignored(receiver):
    body = json.dumps(github_push(ref="refs/heads/feature")).encode()
    response = receiver.post("github", body, github_headers(body))
    assert response.status_code == 200 and response.json()["status"] == "ignored"
    assert receiver.queued() == 0


def test_the_api_service_mounts_the_webhooks_and_counts_deliveries(
    celery_app_configured, store_url
):
    from jobs.api import build_api

    body = json.dumps(github_push()).encode()
    with serve_app(build_api()) as url:
        unsigned = httpx.post(
            f"{url}/webhooks/github", content=body, headers={"X-GitHub-Event": "push"}
        )
        metrics = httpx.get(f"{url}/metrics").text
    assert unsigned.status_code == 401
    assert 'prewarm_webhook_deliveries_total{forge="github",status="401"}' in metrics


def test_a_sha_that_is_not_a_sha_is_422(receiver):
    payload = github_push()
    payload["after"] = "--upload-pack=touch /tmp/pwned"
    body = json.dumps(payload).encode()
    assert receiver.post("github", body, github_headers(body)).status_code == 422
    assert receiver.queued() == 0


def _counted(forge: str, status: int) -> float:
    from prometheus_client import REGISTRY

    labels = {"forge": forge, "status": str(status)}
    return REGISTRY.get_sample_value("prewarm_webhook_deliveries_total", labels) or 0.0


def _nested(depth: int, inner: str = "1") -> bytes:
    return ("[" * depth + inner + "]" * depth).encode()


@pytest.mark.parametrize(
    "body",
    [
        _nested(100_000),
        b'{"repository": ' + _nested(100_000) + b"}",
        ('{"a":' * 50_000 + "1" + "}" * 50_000).encode(),
        b'{"repository": {"full_name": "acme/prompts"}, "x": ' + _nested(40) + b"}",
        b'{"ref": NaN, "repository": {"full_name": "acme/prompts"}}',
        b'{"ref": "refs/heads/main", "after": Infinity, "repository": {"full_name": "acme/prompts"}}',
        b'{"ref": ' + b"9" * 5000 + b"}",
        b'"\\ud800"',
        b"\xff\xfe{}",
        b"",
    ],
    ids=["list-100k", "object-100k", "keys-50k", "depth-50", "nan", "infinity", "huge-int",
         "lone-surrogate", "bad-utf8", "empty"],
)  # fmt: skip
def test_deep_or_odd_signed_json_is_422_and_counted(full_receiver, body):
    counted = _counted("github", 422)
    response = full_receiver.post("github", body, github_headers(body))
    assert response.status_code == 422, response.text
    assert full_receiver.queued() == 0
    assert _counted("github", 422) == counted + 1


def test_deep_json_in_a_form_encoded_delivery_is_422(full_receiver):
    from urllib.parse import urlencode

    body = urlencode({"payload": _nested(60_000).decode()}).encode()
    headers = github_headers(body) | {"Content-Type": "application/x-www-form-urlencoded"}
    assert full_receiver.post("github", body, headers).status_code == 422


def test_deliveries_sharing_a_long_prefix_are_not_a_replay(receiver):
    shared = "d" * 200
    for n, forge in enumerate(["github", "gitea"]):
        body = json.dumps(github_push() if forge == "github" else gitea_push()).encode()
        make = github_headers if forge == "github" else gitea_headers
        header = "X-GitHub-Delivery" if forge == "github" else "X-Gitea-Delivery"
        first = make(body) | {header: shared + "-first"}
        second = make(body) | {header: shared + "-second"}
        assert receiver.post(forge, body, first).status_code == 202
        assert receiver.post(forge, body, second).status_code == 202
        assert receiver.post(forge, body, second).status_code == 409
        assert receiver.queued() == 2 * (n + 1)


def test_an_unexpected_failure_is_answered_500_and_counted(celery_app_configured, store_url):
    def enqueue(repo: str, before: str | None, after: str | None) -> str:
        raise RuntimeError("broker exploded")

    store = redis.Redis.from_url(store_url)
    app = webhook_app(settings=_settings(), store=store, enqueue=enqueue, max_body=MAX_BODY)
    body = json.dumps(github_push()).encode()
    counted = _counted("github", 500)
    with serve_app(app) as url:
        response = httpx.post(f"{url}/webhooks/github", content=body, headers=github_headers(body))
    assert response.status_code == 500 and "broker exploded" not in response.text
    assert _counted("github", 500) == counted + 1
    # The claim was released: the forge's retry of the same delivery is not taken for a replay.
    assert store.keys("prewarm:webhooks:delivery:*") == []
