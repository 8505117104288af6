"""Plans in Redis by id, with their options, progress and per-batch results.

Messages carry a plan id and a batch number only; everything else is read from here::

    pw:plan:<id>            the plan (JSON)
    pw:plan:<id>:opts       its WarmOptions (JSON)
    pw:plan:<id>:meta       hash: engine, batches, items, submitted, finished, counters
    pw:plan:<id>:done       hash: batch -> result (JSON); present = the batch is finished
    pw:plan:<id>:txn        hash: batch -> id of its latest transaction
    pw:plan:<id>:runs       hash: batch -> times work started (redelivery is visible here)
    pw:plan:<id>:claim:<n>  the worker running batch n (expires with its lease)
    pw:plans:open           zset: plans not finished yet -> submitted (read by the sweep)

``meta`` also holds ``active``: the last sign of life of any batch (submitted, claimed, a
claim renewal, a result), which the recovery sweep reads to find plans whose message was lost
with a worker; ``resumed``/``resumed_at``: how often and when the sweep re-queued the plan.

(key names from :mod:`tasks.adapters.redis_keys`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import redis

from pipeline.errors import BadInputError
from pipeline.planner.plan import WarmItem, WarmPlan
from pipeline.wal import PlanProgress
from tasks.adapters import redis_keys
from tasks.adapters.targets.base import WarmOptions
from tasks.adapters.wal_store import as_text

PLAN_TTL_S = 7 * 24 * 3600
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
COUNTERS = ("batches_done", "committed", "rolled_back", "items_ok", "items_failed")
OPEN_PLANS = redis_keys.OPEN_PLANS


def _k(plan_id: str, suffix: str = "") -> str:
    return redis_keys.plan_key(plan_id, suffix)


class PlanStore:
    """Plans, options and progress in prewarm's store."""

    def __init__(self, client: redis.Redis) -> None:
        self.r = client
        self._release = client.register_script(_RELEASE)

    def save(
        self, plan: WarmPlan, engine: str, options: WarmOptions, queue: str | None = None
    ) -> int:
        """Store ``plan`` for ``engine`` (its batches sent to ``queue``, None: the default
        route); returns its number of batches."""
        batches = len(plan.batches(options.batch_size))
        now = time.time()
        meta = {
            "engine": engine,
            "batches": batches,
            "items": len(plan.items),
            "submitted": now,
            "active": now,
            "state": "submitted",
            "queue": queue or "",
        }
        with self.r.pipeline() as pipe:
            pipe.set(_k(plan.plan_id), plan.to_json(), ex=PLAN_TTL_S)
            # Each batch's items on their own, so a batch task reads only its share.
            for n, items in enumerate(plan.batches(options.batch_size)):
                body = json.dumps([item.to_dict() for item in items], ensure_ascii=False)
                pipe.set(_k(plan.plan_id, f"b:{n}"), body, ex=PLAN_TTL_S)
            pipe.set(_k(plan.plan_id, "opts"), json.dumps(asdict(options)), ex=PLAN_TTL_S)
            pipe.hset(_k(plan.plan_id, "meta"), mapping={k: str(v) for k, v in meta.items()})
            pipe.expire(_k(plan.plan_id, "meta"), PLAN_TTL_S)
            pipe.zadd(OPEN_PLANS, {plan.plan_id: now})
            pipe.execute()
        return batches

    def load(self, plan_id: str) -> tuple[WarmPlan, WarmOptions, str]:
        """The plan, its options and its engine name; an unknown id is bad input."""
        raw, opts = self.r.mget(_k(plan_id), _k(plan_id, "opts"))
        engine = self.r.hget(_k(plan_id, "meta"), "engine")
        if raw is None or engine is None:
            raise BadInputError(
                "no such plan (expired or never submitted)", where=f"plan {plan_id}"
            )
        options = WarmOptions.from_dict(json.loads(opts) if opts else None)
        return WarmPlan.from_json(raw, where=f"plan {plan_id}"), options, as_text(engine)

    def load_batch(self, plan_id: str, batch: int) -> tuple[list[WarmItem], WarmOptions, str]:
        """One batch's items, the plan's options and engine, in one round trip."""
        with self.r.pipeline(transaction=False) as pipe:
            pipe.mget(_k(plan_id, f"b:{batch}"), _k(plan_id, "opts"))
            pipe.hget(_k(plan_id, "meta"), "engine")
            (raw, opts), engine = pipe.execute()
        where = f"plan {plan_id} batch {batch}"
        if raw is None or engine is None:
            raise BadInputError("no such plan batch (expired or never submitted)", where=where)
        items = [
            WarmItem.from_dict(d, where=f"{where}: items[{i}]")
            for i, d in enumerate(json.loads(raw))
        ]
        options = WarmOptions.from_dict(json.loads(opts) if opts else None)
        return items, options, as_text(engine)

    def result(self, plan_id: str, batch: int) -> dict[str, Any] | None:
        raw = self.r.hget(_k(plan_id, "done"), str(batch))
        return None if raw is None else json.loads(raw)

    def claim(self, plan_id: str, batch: int, owner: str, lease_s: float) -> bool:
        """Become the one worker running ``batch``; False while another holds it."""
        key = _k(plan_id, f"claim:{batch}")
        claimed = bool(self.r.set(key, owner, nx=True, px=int(lease_s * 1000)))
        if claimed:
            self.touch(plan_id)
        return claimed

    def renew_claim(self, plan_id: str, batch: int, lease_s: float) -> None:
        """Keep the claim (and the plan's sign of life) for another ``lease_s``."""
        with self.r.pipeline() as pipe:
            pipe.pexpire(_k(plan_id, f"claim:{batch}"), int(lease_s * 1000))
            pipe.hset(_k(plan_id, "meta"), "active", time.time())
            pipe.execute()

    def touch(self, plan_id: str, pipe: redis.client.Pipeline | None = None) -> None:
        """Note a sign of life of the plan now."""
        (pipe or self.r).hset(_k(plan_id, "meta"), "active", time.time())

    def release(self, plan_id: str, batch: int, owner: str) -> None:
        """Give the claim up — only if it is still ``owner``'s (it may have expired and been
        taken by another worker meanwhile)."""
        self._release(keys=[_k(plan_id, f"claim:{batch}")], args=[owner])

    def set_txn(
        self, plan_id: str, batch: int, txn_id: str, pipe: redis.client.Pipeline | None = None
    ) -> None:
        """Note ``txn_id`` as the batch's latest transaction (on ``pipe`` when given)."""
        (pipe or self.r).hset(_k(plan_id, "txn"), str(batch), txn_id)

    def txn(self, plan_id: str, batch: int) -> str | None:
        raw = self.r.hget(_k(plan_id, "txn"), str(batch))
        return as_text(raw) if raw else None

    def count_run(self, plan_id: str, batch: int) -> int:
        return int(self.r.hincrby(_k(plan_id, "runs"), str(batch), 1))

    def runs(self, plan_id: str) -> dict[int, int]:
        return {int(k): int(v) for k, v in self.r.hgetall(_k(plan_id, "runs")).items()}

    def record_result(
        self, pipe: redis.client.Pipeline, plan_id: str, summary: dict[str, Any]
    ) -> None:
        """Queue the batch result and progress counters on ``pipe`` (inside the commit MULTI)."""
        meta = _k(plan_id, "meta")
        pipe.hset(_k(plan_id, "done"), str(summary["batch"]), json.dumps(summary))
        pipe.expire(_k(plan_id, "done"), PLAN_TTL_S)
        pipe.hincrby(meta, "batches_done", 1)
        pipe.hincrby(meta, summary["state"], 1)
        pipe.hincrby(meta, "items_ok", summary["ok"])
        pipe.hincrby(meta, "items_failed", summary["failed"])
        pipe.hset(meta, "active", time.time())

    def record_holdings(self, plan_id: str, holdings: dict[str, Any]) -> bool:
        """Record what the plan's post-plan check found (:mod:`tasks.services.holdings`): items
        not held leave the verified count for the failed one. Once per plan (a redelivered
        finish changes nothing); returns whether this call recorded it."""
        meta = _k(plan_id, "meta")
        if not self.r.hexists(meta, "engine"):  # deleted with old plans meanwhile
            return False
        if not self.r.hsetnx(meta, "holdings", json.dumps(holdings)):
            return False
        gone = int(holdings.get("not_held", 0))
        with self.r.pipeline() as pipe:
            pipe.hincrby(meta, "items_ok", -gone)
            pipe.hincrby(meta, "items_failed", gone)
            pipe.execute()
        return True

    def mark_finished(self, plan_id: str) -> None:
        with self.r.pipeline() as pipe:
            pipe.hset(_k(plan_id, "meta"), mapping={"state": "finished", "finished": time.time()})
            pipe.zrem(OPEN_PLANS, plan_id)
            pipe.execute()

    # -- for the recovery sweep ----------------------------------------------------------
    def open_plans(self) -> list[str]:
        """Plans submitted and not finished (oldest first)."""
        return [as_text(raw) for raw in self.r.zrange(OPEN_PLANS, 0, -1)]

    def forget(self, plan_id: str) -> None:
        """Drop an expired plan from the open index."""
        self.r.zrem(OPEN_PLANS, plan_id)

    def progress(self, plan_id: str, txn_alive: Callable[[str], bool]) -> PlanProgress | None:
        """What the sweep needs to know of a plan; None when it expired."""
        meta = {as_text(k): as_text(v) for k, v in self.r.hgetall(_k(plan_id, "meta")).items()}
        if "engine" not in meta:  # (a late write to a deleted plan leaves a part of its meta)
            return None
        batches = int(meta["batches"])
        done = frozenset(int(b) for b in self.r.hkeys(_k(plan_id, "done")))
        left = [n for n in range(batches) if n not in done]
        with self.r.pipeline(transaction=False) as pipe:
            for n in left:
                pipe.exists(_k(plan_id, f"claim:{n}"))
            claims = pipe.execute()
        txns = {int(k): as_text(v) for k, v in self.r.hgetall(_k(plan_id, "txn")).items()}
        live = sum(1 for n in left if n in txns and txn_alive(txns[n]))
        claimed = frozenset(n for n, held in zip(left, claims, strict=True) if held)
        active = float(meta.get("active", meta["submitted"]))
        return PlanProgress(plan_id, batches, done, claimed, live, active)

    def route(self, plan_id: str) -> tuple[WarmOptions, str | None]:
        """The plan's options and the queue its batches were sent to (None: default route)."""
        opts = self.r.get(_k(plan_id, "opts"))
        queue = self.r.hget(_k(plan_id, "meta"), "queue")
        options = WarmOptions.from_dict(json.loads(opts) if opts else None)
        return options, (as_text(queue) if queue else None)

    def claim_resume(self, plan_id: str, hold_s: float) -> bool:
        """Become the one sweep resuming the plan for ``hold_s`` (two sweeps may run at once)."""
        key = _k(plan_id, "resuming")
        return bool(self.r.set(key, "1", nx=True, px=max(1, int(hold_s * 1000))))

    def note_resumed(self, plan_id: str, batches: list[int]) -> None:
        """Record that the sweep re-queued ``batches`` of the plan now."""
        now = time.time()
        with self.r.pipeline() as pipe:
            pipe.hincrby(_k(plan_id, "meta"), "resumed", 1)
            pipe.hset(
                _k(plan_id, "meta"),
                mapping={"active": now, "resumed_at": now, "resumed_from": batches[0]},
            )
            pipe.execute()

    def report(self, plan_id: str) -> dict[str, Any]:
        """Progress of a plan: batches done/total, committed, rolled back, items ok/failed."""
        meta = {as_text(k): as_text(v) for k, v in self.r.hgetall(_k(plan_id, "meta")).items()}
        if "engine" not in meta:  # (a late write to a deleted plan leaves a part of its meta)
            raise BadInputError(
                "no such plan (expired or never submitted)", where=f"plan {plan_id}"
            )
        report: dict[str, Any] = {
            "plan_id": plan_id,
            "engine": meta["engine"],
            "state": meta.get("state", "submitted"),
            "batches": int(meta["batches"]),
            "items": int(meta["items"]),
            "submitted": float(meta["submitted"]),
        }
        report.update({name: int(meta.get(name, 0)) for name in COUNTERS})
        report["done"] = report["batches_done"] >= report["batches"]
        # How often the recovery sweep re-queued this plan after a worker died under it.
        report["resumed"] = int(meta.get("resumed", 0))
        if "resumed_at" in meta:
            report["resumed_at"] = float(meta["resumed_at"])
        if "holdings" in meta:
            report["holdings"] = json.loads(meta["holdings"])
        if "finished" in meta:
            report["seconds"] = round(float(meta["finished"]) - float(meta["submitted"]), 3)
        return report

    def delete(self, plan_id: str) -> int:
        """Forget a plan: its keys and its batches' finished transactions; returns keys removed.

        The loop keeps only an engine's recent plans, so the store does not grow with ticks.
        """
        batches = int(self.r.hget(_k(plan_id, "meta"), "batches") or 0)
        txns = [as_text(t) for t in self.r.hvals(_k(plan_id, "txn"))]
        keys = [_k(plan_id, s) for s in ("", "opts", "meta", "done", "txn", "runs")]
        keys += [_k(plan_id, f"b:{n}") for n in range(batches)]
        keys += [_k(plan_id, f"claim:{n}") for n in range(batches)]
        for txn in txns:
            if as_text(self.r.hget(redis_keys.WAL_TXN.format(txn_id=txn), "state") or b"") in (
                "committed", "rolled_back"
            ):  # fmt: skip
                keys += [redis_keys.WAL_TXN.format(txn_id=txn), f"{redis_keys.WAL_PREFIX}fx:{txn}"]
        return int(self.r.unlink(*keys))

    def results(self, plan_id: str) -> list[dict[str, Any]]:
        """Every finished batch's result, by batch number."""
        rows = [json.loads(v) for v in self.r.hvals(_k(plan_id, "done"))]
        return sorted(rows, key=lambda row: row["batch"])
