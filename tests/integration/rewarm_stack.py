"""A whole re-warm stack for end-to-end tests and the benchmark: git repository, engine
simulator, a real Celery worker on a queue of its own, and the webhook app on real HTTP."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import git
import httpx
import redis

from jobs.simulator import SimulatorConfig, SimulatorServer
from jobs.webhooks import webhook_app
from tasks.repo_tasks import queue_repo_changed
from tasks.settings import EngineSettings, Settings, TemplateRepoSettings
from tests.conftest import REPO_ROOT, worker_env
from tests.integration.http_server import serve

REPO = "acme/prompts"
SECRET = "stack-secret"


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
        self,
        sha: str,
        timeout: float = 60.0,
        states: tuple[str, ...] = ("committed", "rolled_back"),
    ) -> dict:
        """The re-warm record of ``sha`` once it reaches one of ``states``."""
        key = f"pw:templates:{REPO}:txn:{sha}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            raw = self.store.get(key)
            if raw and json.loads(raw)["state"] in states:
                return json.loads(raw)
            time.sleep(0.01)
        raise TimeoutError(f"no re-warm record for {sha} in {states}")


def _config(tmp: Path, src: Path, engine_url: str) -> Path:
    path = tmp / "prewarm.toml"
    path.write_text(
        f'data_dir = "{tmp / "data"}"\n'
        f'[[engines]]\nname = "sim"\nurl = "{engine_url}"\nmodel = "sim-llm"\nkind = "simulator"\n'
        f'[[template_repos]]\nname = "{REPO}"\nurl = "{src}"\nwebhook_secret = "{SECRET}"\n'
    )
    return path


@contextmanager
def _worker(config: Path, queue: str, log: Path) -> Iterator[subprocess.Popen]:
    cmd = [
        sys.executable, "-m", "celery", "-A", "tasks.celery_app:app", "worker", "-Q", queue,
        "--pool", "solo", "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-n", f"rewarm-{uuid.uuid4().hex[:6]}@%h", "--loglevel", "INFO",
    ]  # fmt: skip
    with log.open("wb") as out:
        env = worker_env({"PREWARM_CONFIG": str(config)})
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180  # a loaded 2-core machine starts slowly
            while " ready." not in log.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker not ready:\n{log.read_text(errors='replace')}")
                time.sleep(0.1)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


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
        stack.enter_context(_worker(config, queue, tmp / "worker.log"))
        settings = Settings(
            engines=(EngineSettings(name="sim", url=sim.url, model="sim-llm", kind="simulator"),),
            template_repos=(TemplateRepoSettings(name=REPO, url=str(src), webhook_secret=SECRET),),
        )

        def enqueue(repo: str, before: str | None, after: str | None) -> str:
            return queue_repo_changed(repo, before, after, queue=queue)

        url = stack.enter_context(
            serve(webhook_app(settings=settings, store=store, enqueue=enqueue))
        )
        handle = Stack(source, src, sim.url, url, queue, store, sim)
        handle.commit(files, "first")
        yield handle
        os.environ.pop("PREWARM_CONFIG", None)


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
