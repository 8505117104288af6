"""prewarm's own metrics, kept in the store Redis so one scrape of the api sees the whole cluster.

Whichever worker planned, warmed, rolled back or fired a trigger, it adds to the same series in
the store; ``jobs.api`` reads them at scrape time. Labels are bounded: engine (configured
names), reason (``window``, ``replica``, ``template``, ``trigger``, ``cli``, ``demo``), outcome,
trigger kind, miss cause — never item keys.

Layout (under ``pw:metrics:``)::

    series             hash   JSON [name, labels] -> value (counters add, gauges set)
    plan:<plan_id>     string "engine<TAB>reason" of a submitted plan (8 days)
    warmed:<engine>    hash   "plan:batch" of a committed batch -> JSON [when, item keys]
    planned:<engine>   hash   item key -> when a plan last named it
    engine:<engine>    hash   last engine sample (JSON), last plan's dropped count
    history:<engine>   zset   events by time (samples, plans, batches, restarts, windows),
                              kept for ``HISTORY_S``; what ``prewarm report`` reads

The parts:

- :mod:`.specs`: the metric families the api exposes (:data:`SPECS`), series fields, key names;
- :mod:`.writer`: the ``record_*`` functions, the call sites' one line each; each is one round
  trip or two;
- :mod:`.batches`: a batch's metrics, summed in the worker's process and written every
  ``metrics_flush_s`` (:func:`defer_batch`): the warm-up's hot path pays neither a round trip
  nor a Redis command for them;
- :mod:`.read`: the series, history and warm state as the api, the report and the loop read them.

Every name is importable from here; callers need not know the parts.
"""

from __future__ import annotations

from tasks.adapters.telemetry.batches import (
    PENDING_BATCHES,
    defer_batch,
    flush_batch_metrics,
    flush_interval_s,
    record_batch,
)
from tasks.adapters.telemetry.read import (
    engines_with_history,
    history,
    parse_series,
    plan_labels,
    read_series,
    warm_state,
)
from tasks.adapters.telemetry.specs import (
    ER,
    EXIT_WAIT_S,
    HISTORY_S,
    MAX_ITEMS,
    PREFIX,
    SERIES,
    SPECS,
    MetricSpec,
    Series,
    series_field,
)
from tasks.adapters.telemetry.writer import (
    engine_interval,
    record_engine_sample,
    record_fleet,
    record_gate,
    record_gateway,
    record_intents,
    record_plan,
    record_road_retries,
    record_tick,
    record_trigger,
    record_unverified,
    record_wal,
    record_window,
)

__all__ = [
    "ER",
    "EXIT_WAIT_S",
    "HISTORY_S",
    "MAX_ITEMS",
    "PENDING_BATCHES",
    "PREFIX",
    "SERIES",
    "SPECS",
    "MetricSpec",
    "Series",
    "defer_batch",
    "engine_interval",
    "engines_with_history",
    "flush_batch_metrics",
    "flush_interval_s",
    "history",
    "parse_series",
    "plan_labels",
    "read_series",
    "record_batch",
    "record_engine_sample",
    "record_fleet",
    "record_gate",
    "record_gateway",
    "record_intents",
    "record_plan",
    "record_road_retries",
    "record_tick",
    "record_trigger",
    "record_unverified",
    "record_wal",
    "record_window",
    "series_field",
    "warm_state",
]
