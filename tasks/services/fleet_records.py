"""The records a replica of a fleet plans from, by its fleet's road.

Where placement is spread (:data:`~pipeline.fleet_roads.Road.EVERY_REPLICA`), a prefix's next
user may land on any replica, so a replica plans from what every replica of the fleet served;
elsewhere from its own records, where its prefixes' users landed — except a gated fleet's
warm-ups for another reason than the window (a replica's start-up, warmed before it is
admitted), which plan from every replica's records.

Combined by each replica's window tick, the fleet's records cost every tick a read of every
replica's observations and a prefix detection over all of them: per window N reads and N
detections of N replicas' records, a replica's tick growing with the fleet. So the window ticks
of a fleet share one combination per window: the first of them to plan (in this process)
combines every replica's observations as they stand then, and the fleet's other replicas plan
from it in that window, their prefixes detected once (:class:`DetectedOnce`). What a replica
read after the first plan of the window joins the fleet's records at the next window. A
warm-up for another reason (a replica that restarted, a trigger, a person) combines afresh:
it is one replica's, and wants the newest. A process keeps the latest window's combination of
each fleet only (what every plan of the fleet's replicas held in turn before).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from pipeline.errors import PrewarmError
from pipeline.fleet_roads import Road, road_note, road_of
from pipeline.shared_prefixes import Detect, DetectedOnce, detect_prefixes
from tasks.adapters.observations import Observations
from tasks.settings import EngineSettings, Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FleetRecords:
    """The records a replica plans from, the plan note saying which road and why, and how
    their prefixes are detected (shared by the plans of a window made from the same ones)."""

    records: pd.DataFrame | None
    note: str = ""
    detect: Detect = detect_prefixes


#: (data folder, fleet) → (window, replicas, the window's combination): the latest window only
_WINDOWS: dict[tuple[str, str], tuple[str, tuple[str, ...], FleetRecords]] = {}


def fleet_records(
    settings: Settings, engine: EngineSettings, own: pd.DataFrame | None, window: str | None
) -> FleetRecords:
    """The records ``engine`` plans from (``own``: those it observed), for the window tick of
    ``window`` or (None) a warm-up for another reason; ``own`` for an engine of no fleet."""
    if engine.fleet is None:
        return FleetRecords(own)
    fleet = settings.fleet(engine.fleet)
    note = road_note(fleet.policy)
    # A gated replica's start-up is warmed before it takes any traffic, whatever its road: the
    # share it will take is of every prefix the fleet serves (a new replica has no records).
    gated = fleet.gate and window is None
    if road_of(fleet.policy) is not Road.EVERY_REPLICA and not gated:
        return FleetRecords(own, f"{note}; candidates: this replica's own records")
    replicas = tuple(e.name for e in settings.replicas_of(fleet.name))
    note += f"; candidates: the records of all {len(replicas)} replicas"
    if window is None:
        siblings = [name for name in replicas if name != engine.name]
        return FleetRecords(combined(settings.data_dir, siblings, own), note)
    return _window_records(settings.data_dir, fleet.name, replicas, window, note)


def record_siblings(
    settings: Settings, engine: EngineSettings, window: str | None
) -> list[EngineSettings]:
    """The other replicas whose records (and KV-event holdings) ``engine``'s plan combines with
    its own: every replica's where placement is spread, and for a gated replica's warm-up for
    another reason than the window; none elsewhere."""
    if engine.fleet is None:
        return []
    fleet = settings.fleet(engine.fleet)
    if road_of(fleet.policy) is not Road.EVERY_REPLICA and not (fleet.gate and window is None):
        return []
    return [e for e in settings.replicas_of(fleet.name) if e.name != engine.name]


def read_siblings_first(
    settings: Settings, engine: EngineSettings, observe: Callable[[EngineSettings], object]
) -> None:
    """Before a warm-up of ``engine`` for another reason than the window, ``observe`` what is
    new at the replicas whose records it combines, so that it plans from what they served until
    now, not until their last window tick: a gated replica's start-up planned from its
    siblings' last tick warmed 5 of the 8 templates they served (the rest had been served
    since), and its users missed the other 3. A sibling that cannot be read now (another
    process writes its observations) is left to its own tick."""
    for sibling in record_siblings(settings, engine, None):
        try:
            observe(sibling)
        except PrewarmError as exc:  # (its own warm-ups and ticks report it)
            log.info("%s: %s not read first: %s", engine.name, sibling.name, exc)


def _window_records(
    data_dir: str | Path, fleet: str, replicas: tuple[str, ...], window: str, note: str
) -> FleetRecords:
    """The fleet's combination for ``window``, made by the first replica to ask for it."""
    key = (str(data_dir), fleet)
    kept = _WINDOWS.get(key)
    if kept is not None and kept[:2] == (window, replicas):
        return kept[2]
    records = combined(data_dir, replicas)
    shared = FleetRecords(
        records, note, detect_prefixes if records is None else DetectedOnce(records)
    )
    _WINDOWS[key] = (window, replicas, shared)
    return shared


def combined(
    data_dir: str | Path, replicas: list[str] | tuple[str, ...], first: pd.DataFrame | None = None
) -> pd.DataFrame | None:
    """``first`` and the kept records of ``replicas`` in one frame (``first`` when none has
    any)."""
    frames = [first] + [Observations(data_dir, name).records() for name in replicas]
    kept = [f for f in frames if f is not None and not f.empty]
    return pd.concat(kept, ignore_index=True) if kept else first
