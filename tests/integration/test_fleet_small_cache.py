"""Replicas whose real cache is an eighth of what the settings say (``cache_tokens``), behind
the real ``vllm-router`` with ``power_of_two`` and the real ``sglang-router`` with
``cache_aware``: the plans are cut to the cache each replica publishes, and no item is reported
verified that its users miss. Each case prints its row: items the batches verified, items held
after the plans, first uses from cache, items reported held that users missed. (The replicas
are the engine SIMULATOR.)"""

from __future__ import annotations

import json

import pytest

from tasks.adapters import redis_keys
from tests.integration.fleet_rig import CAPACITY_BLOCKS, FleetRig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TEMPLATES, WORDS = 8, 280  # about 880 simulator tokens (55 blocks) each: 2 fit in 128 blocks
SMALL = CAPACITY_BLOCKS // 8


def template_of(text: str) -> int | None:
    found = [n for n in range(TEMPLATES) if f"Template {n}. " in text]
    return found[0] if found else None


def reported(rig: FleetRig) -> tuple[int, int, dict[tuple[int, str], int]]:
    """Items the batches verified, items the post-plan checks found held, and per (template,
    replica) the items each replica's record says it holds now."""
    verified = sum(b["ok"] for b in rig.warmups.batches if b["state"] == "committed")
    where: dict[tuple[int, str], int] = {}
    for replica in rig.logs():
        for key in rig.store.hkeys(redis_keys.REPLICA_HELD.format(engine=replica)):
            item = rig.warmups.items.get(key.decode())
            n = None if item is None else template_of(item.text or json.dumps(item.messages))
            if n is not None:
                where[(n, replica)] = where.get((n, replica), 0) + 1
    return verified, sum(c["held"] for c in rig.warmups.checks), where


def misreported(
    first: dict[int, tuple[bool, str]], where: dict[tuple[int, str], int], anywhere: bool
) -> int:
    """Items reported held for a template whose first use missed. A spread policy's users land
    anywhere: an item counts against the replica its user hit, unless an earlier first use
    missed there (its prefill may have pushed the item out: a cache of 128 blocks holds two
    templates). A text-keyed router sends users where the prime landed: an item held on any
    replica counts."""
    wrong, pushed = 0, set()
    for n, (hit, replica) in sorted(first.items()):
        if not hit:
            if anywhere:
                wrong += sum(c for (m, _), c in where.items() if m == n)
            elif replica not in pushed:
                wrong += where.get((n, replica), 0)
            pushed.add(replica)
    return wrong


@pytest.mark.parametrize(
    ("router", "policy"), [("vllm-router", "power_of_two"), ("sglang-router", "cache_aware")]
)
def test_a_cache_smaller_than_configured_is_never_reported_warm(
    router, policy, tmp_path, store, store_url
):
    rig = FleetRig(
        tmp_path, policy, 3, store, store_url, WORDS, router=router, capacity_blocks=SMALL
    ).start()
    try:
        rig.traffic(TEMPLATES, 3)
        rig.observe()
        rig.rolling_restart()
        assert rig.warmups.batches, "no warm-up ran"
        notes = " ".join(n for b in rig.warmups.batches for n in b["notes"])
        assert f"cache: {SMALL} blocks of 16 tokens" in notes and "the plan is cut" in notes
        assert all(t <= SMALL * 16 for t in rig.warmups.plan_tokens.values()), rig.warmups
        first = rig.first_uses(TEMPLATES, "small cache")
        verified, held, where = reported(rig)
        wrong = misreported(first, where, anywhere=policy == "cache_aware")
        hits = sum(hit for hit, _ in first.values())
        print(f"\n| {router} {policy} | verified by batches {verified} | held after the plans "
              f"{held} | first uses from cache {hits}/{TEMPLATES} | reported held, users "
              f"missed {wrong} |")  # fmt: skip
        assert wrong == 0, (first, where)
        assert 0 < held <= verified, (held, verified)
    finally:
        rig.stop()
