"""Every Redis key prewarm's own state uses, in one place (the store Redis unless noted).

A module that reads or writes a key takes its name from here, so two modules never spell the
same key two ways, and a reader of the store can find what a key is for. Cache entries served
to users (``pw:v1:…``) are named by :mod:`pipeline.keys`; Celery's own keys by Celery.
"""

from __future__ import annotations

#: prefix of every key below
ROOT = "pw"

# --- warm-up execution --------------------------------------------------------------------------
#: a plan and its parts: ``plan(id)`` (JSON), ``plan(id, "meta")``, ``plan(id, "b:3")`` …
PLAN = ROOT + ":plan:{plan_id}"
#: zset of plans not finished yet -> submitted (read by the recovery sweep)
OPEN_PLANS = ROOT + ":plans:open"
#: write-ahead-log transactions (``tasks.adapters.wal_store``) live under this prefix
WAL_PREFIX = ROOT + ":wal:"
WAL_TXN = WAL_PREFIX + "txn:{txn_id}"
#: the per-engine concurrency semaphore shared by every worker
ENGINE_SEMAPHORE = ROOT + ":sem:{engine}"

# --- the warm-up loop ---------------------------------------------------------------------------
#: how far each source of an engine was read (``IngestState`` as JSON, one field per source)
SOURCE_STATE = ROOT + ":loop:{engine}:sources"
#: what reading each source last found (files, records, errors), one field per source
SOURCE_STATUS = ROOT + ":loop:{engine}:source-status"
#: the engine's last tick and its outcome (JSON)
LOOP_LAST_TICK = ROOT + ":loop:{engine}:last-tick"
#: the last plan of each reason for the engine (hash: reason → JSON)
LOOP_LAST_PLANS = ROOT + ":loop:{engine}:plans"
#: ids of the engine's recent plans, newest first (older ones are deleted)
LOOP_PLAN_IDS = ROOT + ":loop:{engine}:plan-ids"
#: when the engine's next window tick is due (Unix seconds)
LOOP_NEXT_TICK = ROOT + ":loop:{engine}:next-tick"
#: one tick per engine and window: the last window claimed by a tick (Unix seconds)
LOOP_TICK_CLAIM = ROOT + ":loop:{engine}:tick-claim"
#: what the engine's last window tick's plan predicted for its window (hash: item key → hits)
LOOP_WINDOW_PREDICTIONS = ROOT + ":loop:{engine}:window-predictions"
#: the last window of the engine's KV-event counts taken into its observations (Unix seconds)
LOOP_KV_WINDOW = ROOT + ":loop:{engine}:kv-window"
#: one engine's observations are written by one process at a time
LOOP_LOCK = ROOT + ":loop:{engine}:lock"
#: what a tick read but could not write while the shared store was down (hash: records, counts
#: as Parquet bytes), added to the engine's observations by the next tick that can write
LOOP_PENDING_OBSERVATIONS = ROOT + ":loop:{engine}:pending-observations"
#: the beat's lease: held by the one beat that schedules (value: its owner id; it expires)
BEAT_LEASE = ROOT + ":beat:lease"
#: the engine's last drift that plans still answer (JSON: since, until, kind)
LOOP_DRIFT = ROOT + ":loop:{engine}:drift"

# --- replicas and triggers ----------------------------------------------------------------------
REPLICA_LAST = ROOT + ":replicas:{engine}:last"
#: the item keys a replica was found holding when its plans were checked (hash: key -> when)
REPLICA_HELD = ROOT + ":replicas:{engine}:held"
TRIGGER_COOLDOWN = ROOT + ":triggers:cooldown:{kind}:{engine}"
#: rolling state of an engine's cold-cache detectors (JSON)
TRIGGER_DETECTORS = ROOT + ":triggers:{engine}:detectors"

# --- fleets ------------------------------------------------------------------------------------
#: the replica URLs a fleet's router listed at its last look (JSON list), for fleets that take
#: their replicas from the router
FLEET_MEMBERS = ROOT + ":fleets:{fleet}:members"
#: what prewarm last saw of a fleet's router (JSON: up, seen, a restart's time)
FLEET_ROUTER = ROOT + ":fleets:{fleet}:router"
#: the engine request ids of warm-ups sent through a router (zset: id -> when), which carry no
#: id of prewarm's: a replica's log names them, and the loop leaves them out of demand
FLEET_SENT = ROOT + ":fleets:sent"
#: replicas whose warm-up through the fleet's router failed while the router did not answer
#: (hash: engine -> JSON {ts, plan}); warmed again, and taken out, once the router answers
FLEET_ROAD_FAILED = ROOT + ":fleets:{fleet}:road-failed"

# --- the gate -----------------------------------------------------------------------------------
#: each gated replica's episode (hash: engine -> JSON :class:`pipeline.gate.GateRecord`)
GATE = ROOT + ":gate:{fleet}"
#: held by the process looking at a gated replica now (expires: a look that died)
GATE_LOOK = ROOT + ":gate:{fleet}:look:{engine}"

# --- problems -----------------------------------------------------------------------------------
#: what makes ``prewarm status`` exit non-zero and ``/health`` say degraded, each with the time
#: it was first seen (hash: ``<kind>:<subject>`` -> JSON {since, detail}); cleared when it goes
PROBLEMS = ROOT + ":problems"

# --- templates and webhooks ---------------------------------------------------------------------
TEMPLATE_SERVING = ROOT + ":templates:{repo}:serving"
TEMPLATE_TXN = ROOT + ":templates:{repo}:txn:{sha}"
#: requests per template id seen by one source of traffic (an engine's loop, a CLI ingest)
TEMPLATE_HOTNESS = ROOT + ":templates:{repo}:hotness:{source}"
#: the sources that wrote a repository's hotness (a set)
TEMPLATE_HOTNESS_SOURCES = ROOT + ":templates:{repo}:hotness-sources"
TEMPLATE_LOCK = ROOT + ":templates:{repo}:lock"
#: per-repository state of the mirror (``field``: the processed sha, …)
TEMPLATE_STATE = ROOT + ":templates:{repo}:{field}"
WEBHOOK_DELIVERY = ROOT + ":webhooks:delivery:{forge}:{delivery}"

# --- metrics and KV-event state (prefixes: their modules name the keys under them) --------------
METRICS = ROOT + ":metrics:"
KV = ROOT + ":kv:"

# --- health -------------------------------------------------------------------------------------
BEAT_HEARTBEAT = ROOT + ":beat:heartbeat"
#: last success and failure of each periodic task (hash: ``<task>:ok`` / ``<task>:failed``)
TASK_HEALTH = ROOT + ":health:tasks"


def plan_key(plan_id: str, suffix: str = "") -> str:
    """A plan's key, or one of its parts (``meta``, ``opts``, ``b:<n>``, …)."""
    return PLAN.format(plan_id=plan_id) + (f":{suffix}" if suffix else "")
