"""A whole re-warm stack, for the webhook benchmark and the end-to-end tests: a git repository,
the engine simulator, a real Celery worker on a queue of its own, and the webhook app on real
HTTP — every part a product piece (:mod:`jobs.embedded`, :mod:`jobs.simulator`,
:mod:`jobs.webhooks`)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git
import httpx
import redis

from benchmarks.stack import prewarm_environment
from jobs.embedded import WorkerProcess, serve_app
from jobs.simulator import SimulatorConfig, SimulatorServer
from jobs.webhooks import webhook_app
from tasks.adapters.template_serving import transaction
from tasks.repo_tasks import queue_repo_changed
from tasks.settings import EngineSettings, Settings, TemplateRepoSettings

REPO = "acme/prompts"
SECRET = "stack-secret"
FINISHED = ("committed", "rolled_back")


@dataclass
class Stack:
    """Handles on every running part."""

    source: git.Repo
    root: Path
    engine_url: str
    webhook_url: str
    queue: str
    store: redis.Redis
    sim: SimulatorServer

    def commit(self, files: dict[str, str], message: str = "edit") -> str:
        for path, text in files.items():
            target = self.root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        self.source.git.add("--all")
        return self.source.index.commit(message).hexsha

    def push_webhook(self, before: str, after: str) -> httpx.Response:
        """POST a GitHub push delivery for ``before..after``."""
        return post_github_push(self.webhook_url, SECRET, REPO, before, after)

    def wait_txn(
        self, sha: str, timeout: float = 60.0, states: tuple[str, ...] = FINISHED
    ) -> dict[str, Any]:
        """The re-warm record of ``sha`` once it reaches one of ``states``."""
        return wait_rewarm(self.store, REPO, sha, timeout, states, poll_s=0.01)


def wait_rewarm(
    store: redis.Redis,
    repo: str,
    sha: str,
    timeout_s: float = 60.0,
    states: tuple[str, ...] = FINISHED,
    poll_s: float = 0.2,
) -> dict[str, Any]:
    """The re-warm record of ``sha`` in ``repo`` once it reaches one of ``states`` (read from
    the store); ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = transaction(store, repo, sha)
        if record and record["state"] in states:
            return record
        time.sleep(poll_s)
    raise TimeoutError(f"no re-warm record for {sha} in {states} after {timeout_s:.0f}s")


def _config(tmp: Path, src: Path, engine_url: str) -> Path:
    path = tmp / "prewarm.toml"
    path.write_text(
        f'data_dir = "{tmp / "data"}"\n'
        f'[[engines]]\nname = "sim"\nurl = "{engine_url}"\nmodel = "sim-llm"\nkind = "simulator"\n'
        f'[[template_repos]]\nname = "{REPO}"\nurl = "{src}"\nwebhook_secret = "{SECRET}"\n'
    )
    return path


@contextmanager
def _worker(config: Path, queue: str, log: Path, store_url: str) -> Iterator[WorkerProcess]:
    env = {**prewarm_environment(), "PREWARM_STORE_URL": store_url}
    worker = WorkerProcess(config, log, env=env, queues=queue, pool="solo")
    try:
        worker.wait_ready(180)  # a loaded 2-core machine starts slowly
        yield worker
    finally:
        worker.stop()


@contextmanager
def rewarm_stack(tmp: Path, store_url: str, files: dict[str, str]) -> Iterator[Stack]:
    """Start everything around a repository holding ``files`` (committed once)."""
    src = tmp / "src"
    source = git.Repo.init(src, initial_branch="main")
    with source.config_writer() as config:
        config.set_value("user", "name", "Test").set_value("user", "email", "t@example.com")
    queue = f"rewarm-{uuid.uuid4().hex[:8]}"
    store = redis.Redis.from_url(store_url)
    with ExitStack() as stack:
        sim = stack.enter_context(SimulatorServer(SimulatorConfig(capacity_blocks=8192)))
        config = _config(tmp, src, sim.url)
        stack.enter_context(_worker(config, queue, tmp / "worker.log", store_url))
        settings = Settings(
            engines=(EngineSettings(name="sim", url=sim.url, model="sim-llm", kind="simulator"),),
            template_repos=(TemplateRepoSettings(name=REPO, url=str(src), webhook_secret=SECRET),),
        )

        def enqueue(repo: str, before: str | None, after: str | None) -> str:
            return queue_repo_changed(repo, before, after, queue=queue)

        url = stack.enter_context(
            serve_app(webhook_app(settings=settings, store=store, enqueue=enqueue))
        )
        handle = Stack(source, src, sim.url, url, queue, store, sim)
        handle.commit(files, "first")
        yield handle


def post_github_push(
    url: str, secret: str, repo: str, before: str, after: str, timeout_s: float = 30.0
) -> httpx.Response:
    """A GitHub push delivery for ``before..after`` of ``repo``, signed with ``secret``, POSTed
    to ``url``'s ``/webhooks/github``."""
    payload = {
        "ref": "refs/heads/main", "before": before, "after": after,
        "repository": {"full_name": repo, "clone_url": f"https://github.com/{repo}.git"},
        "pusher": {"name": "ada"}, "commits": [],
    }  # fmt: skip
    body = json.dumps(payload).encode()
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json", "X-GitHub-Event": "push",
        "X-GitHub-Delivery": str(uuid.uuid4()), "X-Hub-Signature-256": f"sha256={signature}",
    }  # fmt: skip
    return httpx.post(f"{url}/webhooks/github", content=body, headers=headers, timeout=timeout_s)
