"""Template changes between commits of real git repositories, and the re-warm transaction."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import git
import pytest

from pipeline.errors import BadInputError, EngineUnavailableError
from pipeline.template_diff import ChangeKind, rewarm_set
from tasks.adapters.template_repos import TemplateRepo, last_sha
from tasks.adapters.template_serving import serving, transaction
from tasks.services.rewarm import apply_rewarm
from tasks.settings import TemplateRepoSettings

pytestmark = pytest.mark.integration

SUPPORT = (
    "You are the support assistant of Acme. Be brief and polite.\n"
    "Never promise refunds; link the policy page instead.\n"
    "Escalate outages to the on-call engineer.\n"
    "Customer tier: {{ tier }}\n"
    "{{ question }}\n"
)
BILLING = "Billing desk. Quote the invoice number.\n{% for line in lines %}{{ line|e }}{% endfor %}"
CHAT = "<|system|>{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
PROMPTS = "SYSTEM = 'You answer in French.'\nQA = f'Question: {question}\\nAnswer:'\n"


class Source:
    """A real git repository in a temporary directory that tests commit into."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.repo = git.Repo.init(root, initial_branch="main")
        with self.repo.config_writer() as config:
            config.set_value("user", "name", "Test").set_value("user", "email", "t@example.com")

    def write(self, path: str, text: str) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def commit(self, message: str = "change") -> str:
        self.repo.git.add("--all")
        return self.repo.index.commit(message).hexsha


def _tokenizer_config(default: str, tool: str) -> str:
    return json.dumps(
        {
            "chat_template": [
                {"name": "default", "template": default},
                {"name": "tool_use", "template": tool},
            ]
        }
    )


@pytest.fixture
def source(tmp_path: Path) -> Source:
    src = Source(tmp_path / "src")
    src.write("prompts/support.jinja", SUPPORT)
    src.write("prompts/billing.j2", BILLING)
    src.write("model/tokenizer_config.json", _tokenizer_config(CHAT, "<tools>{{ tools }}"))
    src.write("app/prompts.py", PROMPTS)
    src.write("README.md", "not a template {{ x }}")
    src.commit("first")
    return src


def _mirror(source: Source, tmp_path: Path, **extra) -> TemplateRepo:
    config = TemplateRepoSettings(name="acme/prompts", url=str(source.root), **extra)
    return TemplateRepo(config, tmp_path / "data")


def _diff(source: Source, mirror: TemplateRepo, old: str):
    new = source.commit()
    assert mirror.sync() == new
    changes, rejects = mirror.changes(old, new)
    return changes, rejects, rewarm_set(changes, rejects=rejects)


def test_first_sync_reads_every_template(source, tmp_path):
    mirror = _mirror(source, tmp_path)
    head = mirror.sync()
    ids = sorted(mirror.templates_at(head))
    assert ids == [
        "app/prompts.py#QA", "app/prompts.py#SYSTEM", "model/tokenizer_config.json#default",
        "model/tokenizer_config.json#tool_use", "prompts/billing.j2", "prompts/support.jinja",
    ]  # fmt: skip
    changes, _ = mirror.changes(None, head)
    assert {c.kind for c in changes} == {ChangeKind.ADDED} and len(changes) == 6


def test_from_nothing_every_template_is_added_even_after_later_commits(source, tmp_path):
    mirror = _mirror(source, tmp_path)
    source.write("docs/notes.txt", "unrelated")
    head = source.commit("second")
    assert mirror.sync() == head
    changes, _ = mirror.changes("0" * 40, head)
    assert len(changes) == 6 and {c.kind for c in changes} == {ChangeKind.ADDED}


def test_text_only_edit_rewarms_only_that_template(source, tmp_path):
    mirror = _mirror(source, tmp_path)
    old = mirror.sync()
    source.write("prompts/support.jinja", SUPPORT.replace("brief", "short"))
    changes, _, plan = _diff(source, mirror, old)
    assert [(c.kind, c.template_id) for c in changes] == [
        (ChangeKind.TEXT_ONLY, "prompts/support.jinja")
    ]
    assert [t.template_id for t in plan.warm] == ["prompts/support.jinja"]
    assert [t.template_id for t in plan.retire] == ["prompts/support.jinja"]
    assert plan.warm[0].static_prefix.startswith("You are the support assistant of Acme. Be short")
    assert plan.warm[0].version != plan.retire[0].version


def test_structural_edit(source, tmp_path):
    mirror = _mirror(source, tmp_path)
    old = mirror.sync()
    source.write("prompts/billing.j2", BILLING.replace("line|e", "line|upper"))
    changes, _, plan = _diff(source, mirror, old)
    assert [(c.kind, c.template_id) for c in changes] == [
        (ChangeKind.STRUCTURAL, "prompts/billing.j2")
    ]
    assert len(plan.warm) == 1 and len(plan.retire) == 1


def test_rename_is_detected_and_keeps_content(source, tmp_path):
    mirror = _mirror(source, tmp_path)
    old = mirror.sync()
    source.repo.git.mv("prompts/support.jinja", "prompts/helpdesk.jinja")
    changes, _, plan = _diff(source, mirror, old)
    assert len(changes) == 1
    (change,) = changes
    assert change.kind == ChangeKind.RENAMED and change.edit is None
    assert (change.old.template_id, change.new.template_id) == (
        "prompts/support.jinja",
        "prompts/helpdesk.jinja",
    )
    assert change.old.content == change.new.content
    assert [t.template_id for t in plan.warm] == ["prompts/helpdesk.jinja"]


def test_rename_with_a_text_edit(source, tmp_path):
    mirror = _mirror(source, tmp_path)
    old = mirror.sync()
    source.repo.git.mv("prompts/support.jinja", "prompts/helpdesk.jinja")
    source.write("prompts/helpdesk.jinja", SUPPORT.replace("polite", "kind"))
    (change,), _, _ = _diff(source, mirror, old)
    assert change.kind == ChangeKind.RENAMED and change.edit == ChangeKind.TEXT_ONLY


def test_delete_retires_without_warming(source, tmp_path):
    mirror = _mirror(source, tmp_path)
    old = mirror.sync()
    os.remove(source.root / "prompts/billing.j2")
    changes, _, plan = _diff(source, mirror, old)
    assert [(c.kind, c.template_id) for c in changes] == [
        (ChangeKind.REMOVED, "prompts/billing.j2")
    ]
    assert plan.warm == () and [t.template_id for t in plan.retire] == ["prompts/billing.j2"]


def test_chat_template_change_touches_only_the_named_template(source, tmp_path):
    mirror = _mirror(source, tmp_path)
    old = mirror.sync()
    source.write(
        "model/tokenizer_config.json", _tokenizer_config(CHAT, "<tools>{{ tools|tojson }}")
    )
    changes, _, plan = _diff(source, mirror, old)
    assert [(c.kind, c.template_id) for c in changes] == [
        (ChangeKind.STRUCTURAL, "model/tokenizer_config.json#tool_use")
    ]
    assert plan.warm[0].kind == "chat"


def test_python_module_edit_touches_only_the_edited_string(source, tmp_path):
    mirror = _mirror(source, tmp_path)
    old = mirror.sync()
    source.write("app/prompts.py", PROMPTS.replace("French", "German"))
    changes, _, _ = _diff(source, mirror, old)
    assert [(c.kind, c.template_id) for c in changes] == [
        (ChangeKind.TEXT_ONLY, "app/prompts.py#SYSTEM")
    ]


def test_sandbox_escape_and_outside_symlink_are_rejected_and_old_version_kept(source, tmp_path):
    mirror = _mirror(source, tmp_path)
    old = mirror.sync()
    source.write("prompts/support.jinja", "{{ ''.__class__.__mro__[1].__subclasses__() }}")
    (source.root / "prompts/evil.jinja").symlink_to("../../../../etc/passwd")
    changes, rejects, plan = _diff(source, mirror, old)
    reasons = {r.path: r.reason for r in rejects}
    assert "sandbox escape refused" in reasons["prompts/support.jinja"]
    assert "outside the repository" in reasons["prompts/evil.jinja"]
    assert changes == [] and plan.warm == () and plan.retire == ()


def test_patterns_that_leave_the_repository_are_refused(source, tmp_path):
    with pytest.raises(BadInputError, match="leaves the repository"):
        _mirror(source, tmp_path, patterns=("../other/**/*.jinja",))


def test_only_configured_patterns_count(source, tmp_path):
    mirror = _mirror(source, tmp_path, patterns=("prompts/**/*.jinja",))
    old = mirror.sync()
    source.write("prompts/billing.j2", "changed {{ x }}")
    source.write("prompts/support.jinja", SUPPORT + "more")
    changes, _, _ = _diff(source, mirror, old)
    assert [c.template_id for c in changes] == ["prompts/support.jinja"]


# --- the re-warm transaction on a real Redis ---------------------------------------------------


def test_rewarm_commits_new_versions_only_after_priming_them(source, tmp_path, store):
    mirror = _mirror(source, tmp_path)
    first = mirror.sync()
    base = rewarm_set(mirror.changes(None, first)[0])
    apply_rewarm(store, "acme/prompts", first, base, [], lambda items: None)
    source.write("prompts/support.jinja", SUPPORT.replace("brief", "short"))
    _, _, plan = _diff(source, mirror, first)
    seen_during_prime = []

    def prime(items):
        # While the new version is being warmed, the old one is still the one serving.
        seen_during_prime.append(serving(store, "acme/prompts")["prompts/support.jinja"]["version"])

    head = source.repo.head.commit.hexsha
    apply_rewarm(store, "acme/prompts", head, plan, [], prime)
    assert seen_during_prime == [plan.retire[0].version]
    assert (
        serving(store, "acme/prompts")["prompts/support.jinja"]["version"] == plan.warm[0].version
    )
    assert len(serving(store, "acme/prompts")) == 6
    assert transaction(store, "acme/prompts", head)["state"] == "committed"
    assert last_sha(store, "acme/prompts") == head


def test_failed_rewarm_leaves_the_old_version_serving(source, tmp_path, store):
    mirror = _mirror(source, tmp_path)
    first = mirror.sync()
    apply_rewarm(
        store, "acme/prompts", first, rewarm_set(mirror.changes(None, first)[0]), [], lambda i: None
    )
    before = serving(store, "acme/prompts")
    source.write("prompts/support.jinja", SUPPORT.replace("brief", "short"))
    _, _, plan = _diff(source, mirror, first)

    def prime(items):
        raise EngineUnavailableError("engine down")

    head = source.repo.head.commit.hexsha
    with pytest.raises(EngineUnavailableError):
        apply_rewarm(store, "acme/prompts", head, plan, [], prime)
    assert serving(store, "acme/prompts") == before
    assert last_sha(store, "acme/prompts") == first
    assert transaction(store, "acme/prompts", head)["state"] == "rolled_back"


def test_hotness_from_request_records_orders_the_rewarm(source, tmp_path, store):
    from pipeline.records import records_frame
    from tasks.adapters.template_serving import hotness
    from tasks.services.repo_events import update_hotness
    from tasks.settings import Settings

    prompts = [SUPPORT.split("{{")[0] + "Where is my parcel?"] * 5 + [
        "Billing desk. Quote the invoice number.\nline"
    ] * 9
    prompts += [None, "unrelated prompt"]
    path = tmp_path / "records.parquet"
    records_frame([{"prompt": p, "request_id": str(i)} for i, p in enumerate(prompts)]).to_parquet(
        path
    )
    config = TemplateRepoSettings(name="acme/prompts", url=str(source.root))
    settings = Settings(template_repos=(config,), data_dir=tmp_path / "data")
    summary = update_hotness(settings, store, "acme/prompts", path)
    assert summary == {"repo": "acme/prompts", "requests": 16, "matched": 14}
    heat = hotness(store, "acme/prompts")
    assert heat == {"prompts/support.jinja": 5, "prompts/billing.j2": 9}
    mirror = _mirror(source, tmp_path)
    old = mirror.sync()
    source.write("prompts/support.jinja", SUPPORT.replace("Escalate", "Route"))
    source.write("prompts/billing.j2", BILLING.replace("Quote", "Always quote"))
    changes, _, _ = _diff(source, mirror, old)
    plan = rewarm_set(changes, heat)
    assert [t.template_id for t in plan.warm] == ["prompts/billing.j2", "prompts/support.jinja"]


def test_engines_sharing_a_repository_keep_their_own_hotness(store):
    from tasks.adapters.template_serving import hotness, store_hotness

    store_hotness(store, "acme/prompts", {"a.jinja": 5, "b.jinja": 1}, source="vllm-a")
    store_hotness(store, "acme/prompts", {"b.jinja": 7}, source="vllm-b")
    store_hotness(store, "acme/prompts", {"a.jinja": 2})  # an ingest typed by hand
    store_hotness(store, "acme/prompts", {"b.jinja": 3}, source="vllm-b")  # its next tick
    assert hotness(store, "acme/prompts", "vllm-a") == {"a.jinja": 5, "b.jinja": 1}
    assert hotness(store, "acme/prompts", "vllm-b") == {"b.jinja": 3}
    # an engine with no counts of its own, and the repository as a whole: the sum
    assert hotness(store, "acme/prompts", "vllm-c") == {"a.jinja": 7, "b.jinja": 4}
    assert hotness(store, "acme/prompts") == {"a.jinja": 7, "b.jinja": 4}


def test_pushes_processed_out_of_order_never_step_back(source, tmp_path, store):
    from pipeline.errors import TransientError
    from tasks.services.repo_events import process_push
    from tasks.settings import Settings

    config = TemplateRepoSettings(name="acme/prompts", url=str(source.root))
    settings = Settings(template_repos=(config,), data_dir=tmp_path / "data")
    first = source.repo.head.commit.hexsha
    source.write("prompts/support.jinja", SUPPORT.replace("brief", "short"))
    second = source.commit()
    source.write("prompts/support.jinja", SUPPORT.replace("brief", "terse"))
    third = source.commit()
    assert process_push(settings, store, "acme/prompts", None, third)["status"] == "committed"
    version = serving(store, "acme/prompts")["prompts/support.jinja"]["version"]
    late = process_push(settings, store, "acme/prompts", first, second)
    assert late["status"] == "up-to-date"
    assert serving(store, "acme/prompts")["prompts/support.jinja"]["version"] == version
    assert last_sha(store, "acme/prompts") == third
    lock = store.lock("pw:templates:acme/prompts:lock", timeout=30)
    with lock, pytest.raises(TransientError, match="another push"):
        process_push(settings, store, "acme/prompts", None, third)


def test_polling_queues_only_repositories_with_unprocessed_heads(source, tmp_path, store):
    from tasks.services.repo_events import poll_changed, process_push
    from tasks.settings import Settings

    repos = (
        TemplateRepoSettings(name="acme/prompts", url=str(source.root)),
        TemplateRepoSettings(name="acme/gone", url=str(tmp_path / "missing")),
    )
    settings = Settings(template_repos=repos, data_dir=tmp_path / "data")
    queued: list[tuple] = []

    def enqueue(*args):
        queued.append(args)
        return f"task-{len(queued)}"

    head = source.repo.head.commit.hexsha
    first = poll_changed(settings, store, enqueue)
    assert first["queued"] == {"acme/prompts": "task-1"} and "acme/gone" in first["failed"]
    assert queued == [("acme/prompts", None, head)]
    process_push(settings, store, "acme/prompts", None, head)
    assert poll_changed(settings, store, enqueue)["queued"] == {}
    source.write("prompts/new.jinja", "A new one {{ x }}")
    newer = source.commit()
    assert poll_changed(settings, store, enqueue)["queued"] == {"acme/prompts": "task-2"}
    assert queued[-1] == ("acme/prompts", None, newer)


# --- limits: one bad template never blocks the rest of its push ------------------------------

DEEP = "{% if x %}" * 20_000 + "deep" + "{% endif %}" * 20_000


def test_a_deeply_nested_template_is_rejected_and_the_rest_of_the_push_rewarms(
    source, tmp_path, store
):
    mirror = _mirror(source, tmp_path)
    first = mirror.sync()
    apply_rewarm(
        store, "acme/prompts", first, rewarm_set(mirror.changes(None, first)[0]), [], lambda i: None
    )
    before = serving(store, "acme/prompts")
    source.write("prompts/support.jinja", SUPPORT.replace("brief", "short"))
    source.write("prompts/deep.jinja", DEEP)
    source.write("prompts/parens.j2", "{{ " + "(" * 100_000 + "1" + ")" * 100_000 + " }}")
    deep_json = '{"chat_template": ' + "[" * 100_000 + "]" * 100_000 + "}"
    source.write("model/tokenizer_config.json", deep_json)
    _, rejects, plan = _diff(source, mirror, first)
    assert {r.path for r in rejects} == {
        "prompts/deep.jinja", "prompts/parens.j2", "model/tokenizer_config.json"
    }  # fmt: skip
    assert all("nested deeper" in r.reason for r in rejects)
    assert [t.template_id for t in plan.warm] == ["prompts/support.jinja"]
    head = source.repo.head.commit.hexsha
    apply_rewarm(store, "acme/prompts", head, plan, [], lambda items: None)
    now = serving(store, "acme/prompts")
    assert now["prompts/support.jinja"]["version"] != before["prompts/support.jinja"]["version"]
    # The unreadable chat template keeps its old versions serving.
    assert (
        now["model/tokenizer_config.json#default"] == before["model/tokenizer_config.json#default"]
    )
    assert "prompts/deep.jinja" not in now
    assert transaction(store, "acme/prompts", head)["rejects"]


def test_a_huge_template_is_refused_from_its_size_before_it_is_read(source, tmp_path, monkeypatch):
    mirror = _mirror(source, tmp_path)
    first = mirror.sync()
    (source.root / "prompts").joinpath("huge.jinja").write_bytes(b"a" * (50 * 1024 * 1024))
    reads: list[str] = []
    import git.objects.base

    real = git.objects.base.Object.data_stream.fget

    def counted(blob):
        reads.append(blob.path)
        return real(blob)

    monkeypatch.setattr(git.objects.base.Object, "data_stream", property(counted))
    changes, rejects, _ = _diff(source, mirror, first)
    assert [(r.path, "size limit" in r.reason) for r in rejects] == [("prompts/huge.jinja", True)]
    assert "prompts/huge.jinja" not in reads and not changes


def _git(source: Source, *args: str, stdin: str = "") -> str:
    done = subprocess.run(
        ["git", *args], cwd=source.root, input=stdin, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _commit_with_dotdot_entry(source: Source) -> str:
    """A commit whose root tree has an entry named ``..`` (git's fsck warns; fetch takes it)."""
    blob = _git(source, "hash-object", "-w", "prompts/support.jinja")
    inner = _git(source, "mktree", stdin=f"100644 blob {blob}\tevil.jinja\n")
    listing = _git(source, "ls-tree", "HEAD")
    tree = _git(source, "mktree", stdin=f"{listing}\n040000 tree {inner}\t..\n")
    commit = _git(source, "commit-tree", tree, "-p", "HEAD", "-m", "dotdot")
    _git(source, "update-ref", "refs/heads/main", commit)
    return commit


def test_a_tree_entry_named_dotdot_is_bad_input(source, tmp_path):
    mirror = _mirror(source, tmp_path)
    first = mirror.sync()
    bad = _commit_with_dotdot_entry(source)
    assert mirror.sync() == bad
    with pytest.raises(BadInputError, match="cannot be read safely"):
        mirror.templates_at(bad)
    # The diff names the entry's files as ``../evil.jinja``: refused as a path, never read.
    changes, rejects = mirror.changes(first, bad)
    assert changes == [] and [r.path for r in rejects] == ["../evil.jinja"]
    assert "leaves the repository" in rejects[0].reason
