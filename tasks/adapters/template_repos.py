"""Template repositories on disk: bare mirrors kept with GitPython, diffs with rename detection.

Only the URL and branch from the settings are ever fetched; shas from webhook payloads are
checked to be plain object names before git sees them, so nothing in a payload reaches git as
an option. The last sha whose templates were re-warmed is kept per repository in Redis.
"""

from __future__ import annotations

import fcntl
import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import git
import redis

from pipeline.errors import BadInputError, TransientError
from pipeline.template_diff import (
    FileChange,
    Reject,
    TemplateChange,
    check_patterns,
    classify,
    matches,
    read_templates,
    renames_of,
)
from pipeline.templates import (
    DEFAULT_TEMPLATE_LIMITS,
    Template,
    check_symlink,
    repo_relative_path,
)
from tasks.adapters import redis_keys
from tasks.settings import Settings, TemplateRepoSettings

_SHA = re.compile(r"\A(?:[0-9a-f]{40}|[0-9a-f]{64})\Z")
_SYMLINK_MODE = 0o120000
_STATE_KEY = redis_keys.TEMPLATE_STATE
#: A webhook delivery id is remembered this long (a forge's redelivery comes within days).
DELIVERY_TTL_S = 7 * 24 * 3600
#: Longest one push may hold its repository's lock (a push takes seconds).
PUSH_LOCK_S = 600
_DELIVERY = redis_keys.WEBHOOK_DELIVERY
_LOCK = redis_keys.TEMPLATE_LOCK


def is_null_sha(sha: str | None) -> bool:
    """True for no sha at all, or the all-zero sha forges send for a new branch."""
    return not sha or set(sha) == {"0"}


def check_sha(sha: str, where: str) -> str:
    """A full hex object name, lower-cased; anything else is bad input (never reaches git)."""
    sha = sha.lower()
    if not _SHA.match(sha):
        raise BadInputError(f"not a commit sha: {sha[:80]!r}", where=where)
    return sha


def repo_config(settings: Settings, name: str) -> TemplateRepoSettings:
    """The configured repository called ``name``; unknown names are bad input."""
    for repo in settings.template_repos:
        if repo.name == name:
            return repo
    raise BadInputError(f"unknown template repository {name!r}", where="template_repos")


class TemplateRepo:
    """A configured repository's bare mirror under ``<data_dir>/repos``."""

    def __init__(self, config: TemplateRepoSettings, data_dir: Path) -> None:
        self.config = config
        self.patterns = check_patterns(config.patterns)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", config.name)
        self.path = Path(data_dir) / "repos" / f"{safe}.git"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # Two workers syncing one mirror at once would race on git's own lock files.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.parent / f"{self.path.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _repo(self) -> git.Repo:
        if not self.path.exists():
            return git.Repo.init(self.path, bare=True)
        return git.Repo(self.path)

    def sync(self) -> str:
        """Fetch the configured branch from the configured URL; return its head sha."""
        branch = self.config.branch
        with self._locked():
            repo = self._repo()
            try:
                repo.git.fetch(
                    "--quiet", "--no-tags", "--", self.config.url,
                    f"+refs/heads/{branch}:refs/heads/{branch}",
                )  # fmt: skip
            except git.GitCommandError as exc:
                raise TransientError(f"fetch of {self.config.name} failed: {exc.stderr}") from exc
            return repo.commit(f"refs/heads/{branch}").hexsha

    def resolve(self, ref: str) -> str:
        """The sha a user-given ref (sha, tag, the branch) names in the mirror."""
        if not ref or ref.startswith("-"):
            raise BadInputError("not a commit reference", where=ref or "(empty ref)")
        if ref == "HEAD" or ref.startswith(("HEAD~", "HEAD^")):
            ref = (
                f"refs/heads/{self.config.branch}" + ref[4:]
            )  # the mirror's HEAD is not the branch
        try:
            return str(self._repo().commit(ref).hexsha)
        except (ValueError, git.BadName) as exc:
            raise BadInputError("no such commit in the repository", where=ref) from exc

    def has_commit(self, sha: str) -> bool:
        """Whether the mirror holds ``sha`` (a push may arrive before the fetch sees it)."""
        try:
            self._repo().git.cat_file("-e", f"{check_sha(sha, 'sha')}^{{commit}}")
        except git.GitCommandError:
            return False
        return True

    def is_ancestor(self, older: str, newer: str) -> bool:
        """Whether ``older`` is ``newer`` or one of its ancestors."""
        try:
            self._repo().git.merge_base(
                "--is-ancestor", check_sha(older, "sha"), check_sha(newer, "sha")
            )
        except git.GitCommandError:
            return False
        return True

    def changed_files(self, old: str | None, new: str) -> list[FileChange]:
        """Files changed from ``old`` (None: the empty tree) to ``new``, with renames detected."""
        if is_null_sha(old):
            # Against nothing, every template file is new. (GitPython's NULL_TREE diff runs
            # ``diff-tree --root``, which compares a commit with its parent, not with nothing.)
            return [FileChange("A", path) for path in self.template_files(new)]
        repo = self._repo()
        commit = repo.commit(check_sha(new, "after"))
        base = repo.commit(check_sha(old or "", "before"))
        # GitPython describes commit -> base; R reverses it to base -> commit.
        try:
            found = [_file_change(diff) for diff in commit.diff(base, R=True, M=True)]
        except ValueError as exc:
            raise BadInputError(
                f"diff cannot be read safely ({exc})", where=f"commit {new}"
            ) from exc
        return [f for f in found if self._relevant(f)]

    def _relevant(self, change: FileChange) -> bool:
        paths = [change.path] + ([change.old_path] if change.old_path else [])
        return any(matches(path, self.patterns) for path in paths)

    def read_files(
        self, sha: str, paths: list[str], rejects: list[Reject] | None = None
    ) -> dict[str, bytes]:
        """Bytes of ``paths`` at ``sha`` (missing paths skipped; symlinks followed inside only).

        A path that leaves the repository is appended to ``rejects`` if given, else raised.
        """
        tree = self._repo().commit(check_sha(sha, "sha")).tree
        files = {}
        for path in paths:
            try:
                data = _blob_bytes(tree, repo_relative_path(path))
            except BadInputError as exc:
                if rejects is None:
                    raise
                rejects.append(Reject(path, str(exc)))
                continue
            if data is not None:
                files[path] = data
        return files

    def template_files(self, sha: str) -> list[str]:
        """Every path at ``sha`` that matches the configured patterns.

        A tree GitPython refuses to read (an entry named ``..`` or ``.git``) is bad input.
        """
        tree = self._repo().commit(check_sha(sha, "sha")).tree
        try:
            paths = [str(item.path) for item in tree.traverse() if isinstance(item, git.Blob)]
        except ValueError as exc:
            raise BadInputError(
                f"tree cannot be read safely ({exc})", where=f"commit {sha}"
            ) from exc
        return sorted(path for path in paths if matches(path, self.patterns))

    def templates_at(self, sha: str, rejects: list[Reject] | None = None) -> dict[str, Template]:
        """All templates at ``sha``."""
        return read_templates(self.read_files(sha, self.template_files(sha), rejects), rejects)

    def changes(self, old: str | None, new: str) -> tuple[list[TemplateChange], list[Reject]]:
        """Classified template changes between two commits; unreadable new files are rejects."""
        files = self.changed_files(old, new)
        old_paths = [f.old_path or f.path for f in files if f.status != "A"]
        new_paths = [f.path for f in files if f.status != "D"]
        rejects: list[Reject] = []
        before = (
            {} if is_null_sha(old) else read_templates(self.read_files(old or "", old_paths), [])
        )
        after = read_templates(self.read_files(new, new_paths, rejects), rejects)
        rejected = {r.path for r in rejects}
        # A file that no longer reads keeps its old version serving: drop it from "before".
        before = {k: t for k, t in before.items() if t.path not in rejected}
        return classify(before, after, renames_of(files)), rejects


def _file_change(diff: git.Diff) -> FileChange:
    kind = diff.change_type or "M"
    if kind == "R":
        return FileChange("R", str(diff.b_path), str(diff.a_path))
    if kind == "A":
        return FileChange("A", str(diff.b_path))
    if kind == "D":
        return FileChange("D", str(diff.a_path))
    return FileChange("M", str(diff.b_path or diff.a_path))


def _blob_bytes(tree: git.Tree, path: str, hops: int = 0) -> bytes | None:
    try:
        blob = tree / path
    except KeyError:
        return None
    except ValueError as exc:  # GitPython refuses tree entries such as '..' on the way
        raise BadInputError(f"unreadable tree entry ({exc})", where=path) from exc
    if blob.type != "blob":
        return None
    if blob.size > DEFAULT_TEMPLATE_LIMITS.max_bytes:
        # Refused from the object header, before the blob is read into memory.
        raise BadInputError(
            f"{blob.size} bytes is over the template size limit of "
            f"{DEFAULT_TEMPLATE_LIMITS.max_bytes}",
            where=f"{path}:1",
        )
    data: bytes = blob.data_stream.read()
    if blob.mode != _SYMLINK_MODE:
        return data
    if hops >= 8:
        raise BadInputError("symlink chain too long", where=path)
    return _blob_bytes(tree, check_symlink(path, data.decode(errors="replace")), hops + 1)


def local_repo_config(path: Path) -> TemplateRepoSettings:
    """Settings for an unconfigured local repository: its current branch, default patterns."""
    try:
        source = git.Repo(path)
        branch = source.active_branch.name
    except (TypeError, git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise BadInputError(f"not a git repository with a branch ({exc})", where=str(path)) from exc
    resolved = Path(path).resolve()
    return TemplateRepoSettings(name=resolved.name, url=str(resolved), branch=branch)


# --- processed state in Redis -------------------------------------------------------------------


def _key(repo: str, field: str) -> str:
    return _STATE_KEY.format(repo=repo, field=field)


def sha_key(repo: str) -> str:
    """Redis key of the last processed sha of ``repo``."""
    return _key(repo, "sha")


def last_sha(store: redis.Redis, repo: str) -> str | None:
    """The last sha whose templates were re-warmed, or None."""
    raw = store.get(_key(repo, "sha"))
    return raw.decode() if isinstance(raw, bytes) else raw


def set_last_sha(store: redis.Redis, repo: str, sha: str) -> None:
    """Record ``sha`` as processed."""
    store.set(_key(repo, "sha"), check_sha(sha, "sha"))


def claim_delivery(store: redis.Redis, forge: str, delivery: str, body: bytes) -> bool:
    """Claim a webhook delivery once; False when it was seen before (a replay or redelivery)."""
    ident = delivery or "body-" + hashlib.sha256(body).hexdigest()
    key = _DELIVERY.format(forge=forge, delivery=ident[:200])
    return bool(store.set(key, "1", nx=True, ex=DELIVERY_TTL_S))


def release_delivery(store: redis.Redis, forge: str, delivery: str, body: bytes) -> None:
    """Forget a claimed delivery (its task could not be queued, so the forge may retry)."""
    ident = delivery or "body-" + hashlib.sha256(body).hexdigest()
    store.delete(_DELIVERY.format(forge=forge, delivery=ident[:200]))


def push_lock(store: redis.Redis, repo: str) -> redis.lock.Lock:
    """The lock one push of ``repo`` holds while processed (non-blocking; it expires on its own
    if a worker dies holding it): two pushes side by side could commit out of order."""
    return store.lock(_LOCK.format(repo=repo), timeout=PUSH_LOCK_S, blocking_timeout=0)
