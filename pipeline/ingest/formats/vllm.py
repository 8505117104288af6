"""vLLM logs, v0.4 to current (FORMATS.md section 1): the parser is
:class:`pipeline.ingest.vllm.parser.VllmChunkParser`.

Timestamps are ``MM-DD HH:MM:SS`` in the container's zone with no year: the file's year comes
from ``--year`` or the modification time, a month that falls back by more than six months
starts the next year. ``--max-log-len`` cuts prompts and their ids to N: given, or detected
(:func:`detect_cap`), cut prompts are marked and lose their last block and token count.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest.assemble import finalize_log_records
from pipeline.ingest.chunk import ChunkResult
from pipeline.ingest.formats.base import ChunkParser, FileFacts, LogFormat, Piece
from pipeline.ingest.options import IngestOptions
from pipeline.ingest.vllm.fields import endpoint_of
from pipeline.ingest.vllm.parser import VllmChunkParser
from pipeline.records import arrow_hashes, hashes_column

_LINE = re.compile(
    r"(?:\([^()]+? pid=\d+\) )?.{0,64}?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"\d\d-\d\d \d\d:\d\d:\d\d \[?[^\]\s]+?:\d+\] "
)
_UVICORN = re.compile(r"(?:\([^()]+? pid=\d+\) )?(?:INFO|WARNING|ERROR):\s+\S+ - \"")


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


def year_bases(
    chunks: Sequence[ChunkResult], options: IngestOptions, mtime: float
) -> tuple[list[int], str]:
    """Absolute year at the start of each chunk of a vLLM file, and the assumption made."""
    offsets, total = _rel_years(chunks)
    if options.year is not None:
        return [options.year + o for o in offsets], f"year {options.year} given (first entry)"
    modified = pd.Timestamp(mtime, unit="s", tz="UTC")
    last = next((c.last_ts for c in reversed(chunks) if c.last_ts), None)
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


#: rows from which :func:`resolve_vllm_ts` resolves each distinct time once
_DISTINCT_FROM = 1000


def resolve_vllm_ts(
    text: pd.Series, lines: pd.Series, chunk: ChunkResult, base_year: int, tz: str
) -> pd.Series:
    """``MM-DD HH:MM:SS`` text -> UTC timestamps, years from ``base_year`` and rollovers.

    Each distinct year and text is resolved once: a piece of 10k requests prints a few hundred
    distinct seconds, and joining and parsing its strings row by row took half of this step
    (~1.7 ms a piece, ~0.9 now). A piece's ~100 stats lines are each a second of their own:
    resolved row by row (finding the distinct ones cost them ~0.1 ms more)."""
    rolls = np.searchsorted(np.asarray(chunk.rollovers, dtype="int64"), lines.to_numpy(), "right")
    if len(text) < _DISTINCT_FROM:
        return _resolved_ts(text, base_year + rolls, tz)
    codes = pd.factorize(text)[0].astype(np.int64) + 1  # (missing text: a code of its own)
    inverse, distinct = pd.factorize(codes * (int(rolls.max(initial=0)) + 1) + rolls)
    first = np.empty(len(distinct), dtype=np.int64)
    first[inverse] = np.arange(len(inverse))  # a row of each (any: theirs are alike)
    stamps = _resolved_ts(text.iloc[first], base_year + rolls[first], tz)
    return pd.Series(stamps.array.take(inverse), index=text.index, name=stamps.name)


def _resolved_ts(text: pd.Series, years: np.ndarray, tz: str) -> pd.Series:
    """:func:`resolve_vllm_ts` of ``text``, the year of each row given."""
    years = pd.Series(years, index=text.index).astype(str)
    local = pd.to_datetime(
        years + "-" + text.astype(str), format="%Y-%m-%d %H:%M:%S", errors="coerce"
    )
    stamped = local.dt.tz_localize(tz, ambiguous="NaT", nonexistent="shift_forward")
    return stamped.dt.tz_convert("UTC").astype("datetime64[us, UTC]")


def detect_cap(chunks: Sequence[ChunkResult], options: IngestOptions) -> int | None:
    """``--max-log-len``: given, or detected; ``None`` when the file shows no cap.

    vLLM cuts a prompt to N characters and its token ids to N ids (FORMATS.md 1.3), so a cap
    N shows as prompts of N characters with N ids whose text is too short for that many
    tokens (:func:`pipeline.ingest.vllm.request_lines.cut_looking`), and nothing in the file
    is longer: a prompt of more than N characters, or a list of more than N ids, refutes it.
    Only the longest prompt length can therefore be the cap, and only when evidence names it.
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


def cap_facts(
    chunks: Sequence[ChunkResult], options: IngestOptions
) -> tuple[int | None, tuple[str, ...]]:
    """``--max-log-len`` (:func:`detect_cap`) and the assumption it makes, if any."""
    cap = detect_cap(chunks, options)
    if cap is None:
        return None, ()
    how = "given" if options.max_log_len is not None else "detected"
    return cap, (f"--max-log-len {cap} ({how}): prompts of that length are cut",)


def mark_truncation(frame: pd.DataFrame, cap: int | None) -> None:
    """``prompt_truncated``, and ``prompt_tokens`` from the printed ids unless they were cut;
    a cut prompt's last whole block may hold a cut pseudo-token: it is not a real prefix."""
    has_prompt = frame["prompt"].notna()
    ids_len = frame["_ids_len"]
    truncated = has_prompt & (frame["prompt"].str.len() >= cap) if cap else has_prompt & False
    frame["prompt_truncated"] = truncated.where(has_prompt, pd.NA).astype("boolean")
    if cap:
        ids_len = ids_len.where(ids_len < cap)
        _drop_last_blocks(frame, truncated.fillna(False).to_numpy(dtype=bool))
    frame["prompt_tokens"] = ids_len


def _drop_last_blocks(frame: pd.DataFrame, cut: np.ndarray) -> None:
    """The chains of the ``cut`` rows lose their last block."""
    held = arrow_hashes(frame["prefix_hashes"])
    if held is None:
        frame.loc[cut, "prefix_hashes"] = frame.loc[cut, "prefix_hashes"].map(_drop_last)
    elif cut.any():
        frame["prefix_hashes"] = hashes_column(_without_last(held, cut), frame.index)


def _drop_last(hashes: Any) -> Any:
    return list(hashes)[:-1] if isinstance(hashes, list | tuple | np.ndarray) else hashes


def _without_last(hashes: pa.ListArray, cut: np.ndarray) -> pa.ListArray:
    """:func:`_drop_last` of the ``cut`` rows' lists, in Arrow (missing and empty lists stay
    so)."""
    lengths = pc.fill_null(pc.list_value_length(hashes), 0).to_numpy().astype(np.int64)
    drop = cut & (lengths > 0)
    keep = np.ones(int(lengths.sum()), dtype=bool)
    keep[np.cumsum(lengths)[drop] - 1] = False
    offsets = np.concatenate(([0], np.cumsum(lengths - drop))).astype(np.int32)
    values = pc.list_flatten(hashes).filter(pa.array(keep))
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=hashes.is_null())


@dataclass(frozen=True)
class VllmFormat(LogFormat):
    """vLLM: every envelope since v0.4, request lines joined by id, stats lines as metrics."""

    def matches(self, line: str) -> bool:
        return bool(_LINE.match(line) or _UVICORN.match(line))

    def parser(self, result: ChunkResult, options: IngestOptions, instance: str) -> ChunkParser:
        return VllmChunkParser(result, options.block_size, instance)

    def file_facts(
        self, chunks: Sequence[ChunkResult], options: IngestOptions, mtime: float
    ) -> FileFacts:
        bases, note = year_bases(chunks, options, mtime)
        notes = [note] if any(c.first_ts for c in chunks) else []
        cap, cap_notes = cap_facts(chunks, options)
        return FileFacts(tuple(bases), cap, (*notes, *cap_notes))

    def resolve_ts(self, frame: pd.DataFrame, piece: Piece) -> pd.Series:
        year = piece.facts.year_bases[piece.index]
        return resolve_vllm_ts(frame["ts"], frame["_line"], piece.chunk, year, piece.options.tz)

    def finalize(
        self, frame: pd.DataFrame, facts: FileFacts, options: IngestOptions
    ) -> pd.DataFrame:
        mark_truncation(frame, facts.cap)
        return finalize_log_records(frame, self.source, options)

    def orphan(self, row: dict[str, Any]) -> dict[str, Any]:
        row.setdefault("status", "received")
        row["endpoint"] = endpoint_of(str(row["request_id"]))
        return row


FORMAT = VllmFormat("vllm", "vllm", rank=10, has_metrics=True)
