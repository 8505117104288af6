"""Putting the chunks of one file back together: join tails, resolve timestamps, finalise.

Runs once per file, in the parent, one chunk's frame at a time (memory stays bounded by the
largest chunk, not the file).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.vllm import ENGINE_SUFFIX
from pipeline.records import conform_records

#: statuses that end a request; a later "ok" never overrides them
_FINAL = ("aborted", "failed", "rejected", "overloaded")
_TAIL_COPY = ("prompt", "prefix_hashes", "_ids_len", "output_tokens", "adapter")


# --- timestamps -----------------------------------------------------------------------------


def _month(ts: str | None) -> int:
    return int(ts[:2]) if ts else 0


def _rel_years(chunks: Sequence[ChunkResult]) -> tuple[list[int], int]:
    """Year offset at the start of each chunk, and at the file's last entry."""
    offsets, rel, last_month = [], 0, 0
    for chunk in chunks:
        if chunk.first_ts and _month(chunk.first_ts) < last_month - 6:
            rel += 1
        offsets.append(rel)
        rel += len(chunk.rollovers)
        if chunk.last_ts:
            last_month = _month(chunk.last_ts)
    return offsets, rel


def _last_ts(chunks: Sequence[ChunkResult]) -> str | None:
    return next((c.last_ts for c in reversed(chunks) if c.last_ts), None)


def year_bases(
    chunks: Sequence[ChunkResult], options: IngestOptions, mtime: float
) -> tuple[list[int], str]:
    """Absolute year at the start of each chunk of a vLLM file, and the assumption made."""
    offsets, total = _rel_years(chunks)
    if options.year is not None:
        return [options.year + o for o in offsets], f"year {options.year} given (first entry)"
    modified = pd.Timestamp(mtime, unit="s", tz="UTC")
    last = _last_ts(chunks)
    year = modified.year
    if last is not None:
        guess = pd.Timestamp(f"{year}-{last}", tz=options.tz) if last[:5] != "02-29" else None
        if guess is not None and guess > modified + pd.Timedelta(days=1):
            year -= 1
    first_year = year - total
    note = (
        f"year {first_year} assumed for the first entry (last entry on or before the file's "
        f"modification time {modified:%Y-%m-%d}); timezone {options.tz}"
    )
    return [first_year + o for o in offsets], note


def resolve_vllm_ts(
    text: pd.Series, lines: pd.Series, chunk: ChunkResult, base_year: int, tz: str
) -> pd.Series:
    """``MM-DD HH:MM:SS`` text -> UTC timestamps, years from ``base_year`` and rollovers."""
    rolls = np.searchsorted(np.asarray(chunk.rollovers, dtype="int64"), lines.to_numpy(), "right")
    years = pd.Series(base_year + rolls, index=text.index).astype(str)
    local = pd.to_datetime(
        years + "-" + text.astype(str), format="%Y-%m-%d %H:%M:%S", errors="coerce"
    )
    stamped = local.dt.tz_localize(tz, ambiguous="NaT", nonexistent="shift_forward")
    return stamped.dt.tz_convert("UTC").astype("datetime64[us, UTC]")


def resolve_tgi_ts(frame: pd.DataFrame) -> pd.Series:
    """Event time (UTC, µs) minus the request's total time: the arrival time."""
    ts = pd.to_datetime(frame["ts"].astype(str), utc=True, format="ISO8601", errors="coerce")
    back = pd.to_timedelta(frame["_ts_minus_s"].fillna(0.0).astype(float), unit="s")
    return (ts - back).astype("datetime64[us, UTC]")


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
                frame.at[index, column] = tail[column]
        delta = tail.get("_delta_tokens")
        if delta is not None and tail.get("output_tokens") is None:
            before = frame.at[index, "output_tokens"]
            frame.at[index, "output_tokens"] = delta + (0 if _missing(before) else before)
    return used


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value))


# --- records --------------------------------------------------------------------------------


def detect_cap(chunks: Sequence[ChunkResult], options: IngestOptions) -> int | None:
    """``--max-log-len``: given, or detected; ``None`` when the file shows no cap.

    vLLM cuts a prompt to N characters and its token ids to N ids (FORMATS.md 1.3), so a cap
    N shows as prompts of N characters with N ids whose text is too short for that many
    tokens (:func:`pipeline.ingest.vllm.cut_looking`), and nothing in the file is longer: a
    prompt of more than N characters, or a list of more than N ids, refutes it. Only the
    longest prompt length can therefore be the cap, and only when evidence names it.
    """
    if options.max_log_len is not None:
        return options.max_log_len
    evidence: Counter[int] = Counter()
    longest_prompt = longest_ids = 0
    for chunk in chunks:
        evidence.update(chunk.cap_evidence)
        longest_prompt = max(longest_prompt, chunk.longest_prompt)
        longest_ids = max(longest_ids, chunk.longest_ids)
    if evidence[longest_prompt] and longest_ids <= longest_prompt:
        return longest_prompt
    return None


def finalize_log_records(
    frame: pd.DataFrame, source: str, cap: int | None, options: IngestOptions
) -> pd.DataFrame:
    """Truncation, token counts and filled-in options; canonical columns out."""
    frame["source"] = source
    has_prompt = frame["prompt"].notna()
    ids_len = frame["_ids_len"]
    if source == "vllm":
        truncated = has_prompt & (frame["prompt"].str.len() >= cap) if cap else has_prompt & False
        frame["prompt_truncated"] = truncated.where(has_prompt, pd.NA).astype("boolean")
        if cap:
            ids_len = ids_len.where(ids_len < cap)
            cut = truncated.fillna(False).to_numpy(dtype=bool)
            frame.loc[cut, "prefix_hashes"] = frame.loc[cut, "prefix_hashes"].map(_drop_last)
        frame["prompt_tokens"] = ids_len
    frame["prefix_hashes"] = [h if isinstance(h, list) else None for h in frame["prefix_hashes"]]
    for column in ("model", "tenant"):
        value = getattr(options, column)
        if value is not None:
            frame[column] = frame[column].fillna(value)
    return conform_records(frame)


def _drop_last(hashes: Any) -> Any:
    """A cut prompt's last whole block may hold a cut pseudo-token: it is not a real prefix."""
    return list(hashes)[:-1] if isinstance(hashes, list | tuple | np.ndarray) else hashes


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
