"""prewarm's own requests in an engine's log are not demand (pure).

Every request prewarm sends an engine (primes, probes, token counts) carries a request id of
its own, ``prewarm-<32 hex>`` (the ``X-Request-Id`` header). vLLM builds its request ids from
that header (``cmpl-<id>-<n>``, ``chatcmpl-<id>``), and so does the engine simulator, so the
engine's log names them. The loop reads that log back as what users asked: without this filter
every warm-up would count as traffic, and a prefix primed as rendered chat text through
``/v1/completions`` would come back as a completions prefix of its own (other parameters,
other tokens) — the warm-up feeding its own forecast.
"""

from __future__ import annotations

import re

import pandas as pd

from pipeline.windows import COUNT_DTYPES, KEYS, item_window_counts

#: the part of a request id that names prewarm (before 32 hex digits)
OWN_REQUEST_TAG = "prewarm-"
_OWN = re.compile(r"(?:^|-)prewarm-[0-9a-f]{32}(?:-|$)")
_VALUES = ["requests", "prompt_tokens", "output_tokens"]


def own_request_id(random_hex: str) -> str:
    """The request id prewarm sends, from 32 random hex digits (the caller's randomness)."""
    if len(random_hex) != 32:
        raise ValueError("a request id needs 32 hex digits")
    return OWN_REQUEST_TAG + random_hex


def is_own_request(request_id: object) -> bool:
    """Whether an engine's request id was built from one of prewarm's (see the module doc)."""
    return isinstance(request_id, str) and _OWN.search(request_id) is not None


def own_mask(records: pd.DataFrame, sent: frozenset[str] = frozenset()) -> pd.Series:
    """True for each record prewarm sent itself: tagged with its id, or one of the engine
    request ids in ``sent`` — the ids a router's replica gave prewarm's warm-ups, which go
    through the router with no id of prewarm's (a completion's log id ``cmpl-<id>-<n>`` is
    matched by its response's ``cmpl-<id>``)."""
    if "request_id" not in records.columns or records.empty:
        return pd.Series(False, index=records.index, dtype=bool)
    ids = records["request_id"]
    mask = ids.map(is_own_request).astype(bool)
    if sent:
        base = ids.astype("string").str.replace(r"-\d+$", "", regex=True)
        mask |= ids.isin(sent).to_numpy() | base.isin(sent).fillna(False).to_numpy(dtype=bool)
    return mask


def without_own_requests(
    records: pd.DataFrame,
    counts: pd.DataFrame | None,
    window: str,
    sent: frozenset[str] = frozenset(),
) -> tuple[pd.DataFrame, pd.DataFrame | None, int]:
    """``records`` and their item × window ``counts`` without prewarm's own requests, and how
    many were left out. Counts are additive, so the own records' counts are subtracted (a
    source's counts that came without records stay as they are)."""
    mask = own_mask(records, sent)
    dropped = int(mask.sum())
    if not dropped:
        return records, counts, 0
    kept = records[~mask].reset_index(drop=True)
    if counts is None or counts.empty:
        return kept, counts, dropped
    own = item_window_counts(records[mask], window)
    merged = counts.merge(own, on=[*KEYS, "window_start"], how="left", suffixes=("", "_own"))
    for column in _VALUES:
        merged[column] = (merged[column] - merged[f"{column}_own"].fillna(0)).clip(lower=0)
    merged = merged[merged["requests"] > 0]
    return kept, merged[list(COUNT_DTYPES)].astype(COUNT_DTYPES).reset_index(drop=True), dropped
