"""Re-warm of changed templates as one transaction: new versions commit before old ones retire.

Per repository, a Redis hash maps each template id to the version that is *serving*. A re-warm

1. records its intent (the versions to warm and to retire) before any side effect,
2. primes the new versions' static prefixes into the configured engines — planned by the one
   planner (reason ``template``) for completions users (the head as a prompt) and chat users
   (the head as the system message, rendered by the engine's own chat template) alike, hottest
   last — and warms the engines' gateways with the requests their clients repeat that a
   changed head rendered, as the new head renders them; each engine's items as one
   transaction in the warm-up WAL (``tasks.services.batch_runner``),
3. on success flips the serving versions and the processed sha in one ``MULTI``/``EXEC``;
   the gateways' entries of the retired versions age out by each gateway's TTL (prewarm keeps
   no cache of its own to delete them from).

If priming fails the record says ``rolled_back`` and nothing else changed: the old versions keep
serving, and the next push or poll tries again from the last processed sha.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pipeline.errors import EngineUnavailableError, PrewarmError
from pipeline.own_requests import own_mask
from pipeline.planner.candidates import TemplateHead, template_head_items
from pipeline.planner.gateway import HeadChange, changed_template_items
from pipeline.planner.plan import WarmItem, WarmPlan
from pipeline.planner.reasons import PlanReason
from pipeline.records import records_frame
from pipeline.template_diff import RewarmSet, version_tag
from pipeline.templates import Template
from pipeline.wal import TxnState
from tasks.adapters.observations import Observations
from tasks.adapters.plan_store import PlanStore
from tasks.adapters.store import Store
from tasks.adapters.targets.base import WarmOptions
from tasks.adapters.telemetry import record_plan
from tasks.adapters.template_serving import (
    TXN_KEY,
    commit_serving,
    hotness,
    record_transaction,
    serving,
    store_hotness,
)
from tasks.services import planning
from tasks.services.batch_runner import BatchRunner
from tasks.settings import EngineSettings, Settings, TemplateRepoSettings

Primer = Callable[[Sequence[WarmItem]], None]

#: How far into a prompt a template's head may start (a chat template's role header first).
HEAD_OFFSET_CHARS = 64


def apply_rewarm(
    store: Store,
    repo: str,
    sha: str,
    rewarm: RewarmSet,
    items: Sequence[WarmItem],
    prime: Primer,
) -> dict[str, Any]:
    """Warm ``items``, then commit the new versions; see the module doc."""
    txn_key = TXN_KEY.format(repo=repo, sha=sha)
    record: dict[str, Any] = {"repo": repo, "sha": sha, "started": time.time(), **rewarm.summary()}
    record_transaction(store, txn_key, record, state=str(TxnState.APPLYING), items=len(items))
    try:
        prime(items)
    except PrewarmError as exc:
        record_transaction(store, txn_key, record, state=str(TxnState.ROLLED_BACK), error=str(exc))
        raise
    commit_serving(store, repo, sha, rewarm, txn_key)
    record_transaction(store, txn_key, record, state=str(TxnState.COMMITTED), committed=time.time())
    return record


# --- priming engines ----------------------------------------------------------------------------


def engines_for(settings: Settings, repo: TemplateRepoSettings) -> list[EngineSettings]:
    """Engines serving the repository's model (every engine when the repository names none)."""
    return [e for e in settings.engines if repo.model is None or e.model == repo.model]


def run_in_wal(
    settings: Settings, store: Store, engine: EngineSettings, plan: WarmPlan
) -> dict[str, Any]:
    """Run ``plan`` (the planner's plan for ``engine``: its id, items and notes) as one WAL
    transaction (one batch), in this process.

    The re-warm needs the outcome before it may flip the serving versions, and a task must not
    wait on other tasks, so the batch runs here rather than as a chord.
    """
    options = WarmOptions(batch_size=len(plan.items))
    PlanStore(store).save(plan, engine.name, options)
    record_plan(store, plan, engine.name)
    summary = BatchRunner(store, settings).run(plan.plan_id, 0)
    if summary.get("state") != "committed":
        raise EngineUnavailableError(
            f"re-warm on {engine.name} {summary.get('state')}: {summary.get('failures')}"
        )
    return summary


def template_heads(templates: Iterable[Template], heat: Mapping[str, int]) -> list[TemplateHead]:
    """The static heads of ``templates``, with their hotness, for the planner's template
    candidates (one completions and one chat item per head, so both kinds of users hit). A
    serving template is used at least once more even when no request of it was seen yet: its
    new version is always worth warming, the hottest last."""
    return [
        TemplateHead(version_tag(t), t.static_prefix, 1.0 + heat.get(t.template_id, 0))
        for t in templates
        if t.static_prefix
    ]


def head_changes(rewarm: RewarmSet, old_heads: Mapping[str, str]) -> list[HeadChange]:
    """The changed templates whose static head changed: the serving version's head (by template
    id, ``old_heads``) against the new version's."""
    changes = []
    for template in rewarm.warm:
        old = old_heads.get(template.template_id)
        if old and template.static_prefix and old != template.static_prefix:
            changes.append(HeadChange(old, template.static_prefix, version_tag(template)))
    return changes


def gateway_rewarm_items(
    settings: Settings, engine: EngineSettings, changes: Sequence[HeadChange]
) -> list[WarmItem]:
    """The requests clients of ``engine``'s gateways repeat that the changed templates rendered,
    as their new versions render them (from the engine's observations; prewarm's own left
    out). The old versions' entries age out by the gateway's TTL."""
    gateways = settings.gateways_of(engine.name)
    records = Observations(settings.data_dir, engine.name).records() if gateways else None
    if not changes or records is None or records.empty:
        return []
    users = records[~own_mask(records)]
    return [item for g in gateways for item in changed_template_items(
        users, g.name, changes, g.min_count, HEAD_OFFSET_CHARS)]  # fmt: skip


def template_plan(
    settings: Settings,
    engine: EngineSettings,
    rewarm: RewarmSet,
    heat: Mapping[str, int],
    old_heads: Mapping[str, str] | None = None,
) -> WarmPlan:
    """The one planner's plan (reason ``template``) for the new versions on ``engine``: their
    heads, and the gateways' entries of the changed templates' frequent requests."""
    extra = template_head_items(template_heads(rewarm.warm, heat), engine.model)
    extra += gateway_rewarm_items(settings, engine, head_changes(rewarm, old_heads or {}))
    request = planning.plan_request(settings, engine.name)
    return planning.plan_for(records_frame([]), request, reason=PlanReason.TEMPLATE,
                             engine=engine, forecast="frequency", extra=extra)  # fmt: skip


def update_template_hotness(
    settings: Settings, store: Store, engine: EngineSettings, prompts: Iterable[object]
) -> dict[str, int]:
    """Requests per serving template of the repositories ``engine`` serves, from its prompts
    (longest head found at the start, or just after a chat template's role header); stored as
    the repositories' hotness, so a re-warm primes the hottest last. Returns matches per repo."""
    heads: dict[str, tuple[str, str]] = {}
    for repo in settings.template_repos:
        if repo.model in (None, engine.model):
            for template_id, record in serving(store, repo.name).items():
                if record.get("static_prefix"):
                    heads[record["static_prefix"]] = (repo.name, template_id)
    if not heads:
        return {}
    ordered = sorted(heads, key=len, reverse=True)
    counts: dict[str, Counter[str]] = {}
    for prompt in prompts:
        if not isinstance(prompt, str):
            continue
        for head in ordered:
            if prompt.find(head, 0, HEAD_OFFSET_CHARS + len(head)) >= 0:
                name, template_id = heads[head]
                counts.setdefault(name, Counter())[template_id] += 1
                break
    for name, repo_counts in counts.items():
        store_hotness(store, name, dict(repo_counts), source=engine.name)
    return {name: sum(c.values()) for name, c in counts.items()}


def rewarm_repo(
    settings: Settings, store: Store, repo: TemplateRepoSettings, sha: str, rewarm: RewarmSet
) -> dict[str, Any]:
    """Re-warm one repository's changed templates on every engine that serves its model."""
    engines = engines_for(settings, repo)
    old_heads = {tid: str(record.get("static_prefix") or "")
                 for tid, record in serving(store, repo.name).items()}  # fmt: skip
    per_engine = {
        e.name: template_plan(settings, e, rewarm, hotness(store, repo.name, e.name), old_heads)
        for e in engines
    }

    def prime(_: Sequence[WarmItem]) -> None:
        for engine in engines:
            if per_engine[engine.name].items:
                run_in_wal(settings, store, engine, per_engine[engine.name])

    items = [item for plan in per_engine.values() for item in plan.items]
    return apply_rewarm(store, repo.name, sha, rewarm, items, prime)
