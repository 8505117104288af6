"""Putting the chunks of one file back together: join tails, finalise.

What every log format shares; what differs between formats (timestamps, truncation) lives in
its module of :mod:`pipeline.ingest.formats`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from pipeline.ingest.options import IngestOptions
from pipeline.ingest.vllm.requests import ENGINE_SUFFIX
from pipeline.records import arrow_hashes, conform_records, listed_hashes

#: statuses that end a request; a later "ok" never overrides them
_FINAL = ("aborted", "failed", "rejected", "overloaded")
_TAIL_COPY = ("prompt", "prefix_hashes", "_ids_len", "output_tokens", "adapter")


# --- joining tails --------------------------------------------------------------------------


def _status(head: Any, tail: Any) -> Any:
    if tail is None or (isinstance(tail, float) and np.isnan(tail)):
        return head
    if head in _FINAL and tail == "ok":
        return head
    return tail


def apply_tails(frame: pd.DataFrame, tails: dict[str, dict[str, Any]]) -> set[str]:
    """Patch ``frame`` rows with what later chunks said of them; return the ids used."""
    if not tails or frame.empty:
        return set()
    positions = {rid: i for i, rid in enumerate(frame["request_id"].tolist()) if rid is not None}
    used: set[str] = set()
    for tail_id, tail in tails.items():
        row = positions.get(tail_id)
        if row is None:
            row = positions.get(ENGINE_SUFFIX.sub("", tail_id))
        if row is None:
            continue
        used.add(tail_id)
        index = frame.index[row]
        frame.at[index, "status"] = _status(frame.at[index, "status"], tail.get("status"))
        for column in _TAIL_COPY:
            if tail.get(column) is not None and _missing(frame.at[index, column]):
                if column == "prefix_hashes":  # Arrow lists take no list in place
                    listed_hashes(frame)
                frame.at[index, column] = tail[column]
        delta = tail.get("_delta_tokens")
        if delta is not None and tail.get("output_tokens") is None:
            before = frame.at[index, "output_tokens"]
            frame.at[index, "output_tokens"] = delta + (0 if _missing(before) else before)
    return used


#: a tail in flight: its piece, its place there, its request id, what it says
_Tail = tuple[int, int, str, dict[str, Any]]


def later_tails(
    tails: Sequence[dict[str, dict[str, Any]]], head_ids: Sequence[Sequence[str]]
) -> Iterator[dict[str, dict[str, Any]]]:
    """For each piece, in order, what later pieces said of requests that may have their head
    in it (``tails`` and ``head_ids``: each piece's). A tail belongs to the latest head with
    its id before it, so a later piece's tail is skipped once a piece in between holds a head
    or a tail with that id (an id reused by the client, or a log that repeats itself).

    One pass over the pieces finds, for every tail, the last piece before it that names its
    id: the tail reaches back to that piece and no further. Then each piece's tails are those
    in reach, in piece order: linear in the pieces, not quadratic."""
    starts: defaultdict[int, list[_Tail]] = defaultdict(list)
    wanted = {_base(key) for piece in tails for key in piece}
    named: dict[str, int] = {}  # the last piece that named an id some tail has
    for j, piece in enumerate(tails):
        seen: set[str] = set()
        for order, (key, tail) in enumerate(piece.items()):
            base = _base(key)
            if base in seen:  # (an outcome seen before its id was reused: the first counts)
                continue
            seen.add(base)
            start = named.get(base, 0)
            if start < j:
                starts[start].append((j, order, base, tail))
        named.update(dict.fromkeys(seen, j))
        named.update((i, j) for i in head_ids[j] if i in wanted)
    reach: list[_Tail] = []
    for i in range(len(tails)):
        reach = sorted([t for t in reach if t[0] > i] + starts.pop(i, []), key=_piece_order)
        yield {base: tail for _, _, base, tail in reach}


def _base(key: str) -> str:
    return key.split("\x00", 1)[0]


def _piece_order(tail: _Tail) -> tuple[int, int]:
    return tail[0], tail[1]


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value))


# --- records --------------------------------------------------------------------------------


def finalize_log_records(frame: pd.DataFrame, source: str, options: IngestOptions) -> pd.DataFrame:
    """Filled-in options and chains as lists; canonical columns out."""
    frame["source"] = source
    hashes = frame["prefix_hashes"]
    if arrow_hashes(hashes) is None:  # (Arrow lists hold lists or missing values already)
        if hashes.isna().all():  # a log without prompts (TGI text): no per-row pass
            frame["prefix_hashes"] = None
        else:
            frame["prefix_hashes"] = [h if isinstance(h, list) else None for h in hashes]
    for column in ("model", "tenant"):
        value = getattr(options, column)
        if value is not None:
            frame[column] = frame[column].fillna(value)
    return conform_records(frame)


def orphan_records(tails: dict[str, dict[str, Any]], skip: set[str]) -> list[dict[str, Any]]:
    """Tails that joined no head: requests whose defining line is not in this file or run."""
    rows = []
    for tail_id, tail in tails.items():
        base = tail_id.split("\x00", 1)[0]
        if base in skip or ENGINE_SUFFIX.sub("", base) in skip:
            continue
        row = {**tail, "request_id": base}
        delta = row.pop("_delta_tokens", None)
        if delta is not None and row.get("output_tokens") is None:
            row["output_tokens"] = delta
        rows.append(row)
    return rows
