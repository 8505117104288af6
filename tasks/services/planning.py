"""Building a plan for a configured engine from ingested records (``prewarm ingest --out DIR``).

``plan_for`` (the one planning service) reads the engine's cache capacity, prefill cost, tenant
weights, budget shares and tenant isolation from settings, forecasts next-window hits, and
returns the plan.
The forecast is the learned hotness model (``models.forecaster``): the version ``prewarm.model.
retrain`` saved under ``<data_dir>/models/hotness`` when there is a usable one, else one fitted
on the ingest's counts (``counts.parquet`` or ``windows.parquet``) when they have enough
history; the frequency estimate of the records otherwise.

Token counts are measured through the engine's own tokenizer (``POST /tokenize``, offered by
vLLM and the simulator) before budgeting, so the token budget (the engine's cache capacity) is
in the engine's units; when the engine does not answer, the pseudo-token estimate stays.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from pipeline.errors import BadInputError, PrewarmError
from pipeline.intents.requests import IntentWindow
from pipeline.own_requests import own_mask
from pipeline.planner.candidates import PlanRequest, candidates, plan_from_candidates
from pipeline.planner.gateway import gateway_items
from pipeline.planner.plan import (
    DEFAULT_PREFILL_S_PER_TOKEN,
    EngineCost,
    PlanBudget,
    WarmItem,
    WarmPlan,
)
from pipeline.planner.reasons import PlanReason, plan_reason
from pipeline.planner.recency import OLDER_WINDOW_WEIGHT
from pipeline.shared_prefixes import Detect, detect_prefixes
from pipeline.tables import read_parquet_file
from tasks.adapters.engine_tokens import engine_cache, measure_tokens
from tasks.settings import MIN_WINDOWS_FOR_MODEL, EngineSettings, Settings

log = logging.getLogger(__name__)


def read_records(source: Path) -> tuple[pd.DataFrame, Path | None]:
    """Records from an ingest directory or a ``records.parquet``; also its item-window counts
    (``counts.parquet``, else ``windows.parquet``) when present."""
    path = source / "records.parquet" if source.is_dir() else source
    if not path.exists():
        raise BadInputError(
            "no records.parquet here (run `prewarm ingest --out DIR`)", where=str(source)
        )
    records = read_parquet_file(path, "records")
    # counts.parquet is the counts shape alone; windows.parquet (older ingests) adds features
    counts = [path.parent / name for name in ("counts.parquet", "windows.parquet")]
    return records, next((c for c in counts if c.exists()), None)


def _prediction_map(predicted: pd.DataFrame) -> dict[str, float]:
    keys, values = predicted["item_key"].astype(str), predicted["predicted"].astype(float)
    return dict(zip(keys, values, strict=True))


def saved_forecast(
    prefixes: pd.DataFrame, models_root: Path
) -> tuple[dict[str, float], str] | None:
    """Predictions of the current saved forecaster (``prewarm.model.retrain``'s backtest
    winner) and its note, or None when there is none or it cannot be used by this code (it
    is then refitted)."""
    from models.forecaster import SAVED_NAME
    from models.selection import load_selected

    if not (models_root / SAVED_NAME).exists():
        return None
    try:
        saved = load_selected(models_root, SAVED_NAME)
        predicted = _prediction_map(saved.model.predict_next(prefixes, kind="prefix"))
        return predicted, "saved" if saved.winner is None else f"saved, winner={saved.winner}"
    except (PrewarmError, KeyError, ValueError) as exc:
        log.info("saved forecaster unusable (%s); fitting one", exc)
        return None


#: A forecast: predicted next-window hits by item key (None: the frequency estimate), and a note.
Forecast = tuple[dict[str, float] | None, str]


def choose_forecast(
    windows: pd.DataFrame | Path | None,
    models_root: Path | None = None,
    *,
    forecast: str = "auto",
    min_windows: int = MIN_WINDOWS_FOR_MODEL,
) -> Forecast:
    """The one choice of forecaster for a plan: the saved backtest winner under ``models_root``
    when there is a usable one; else one fitted on ``windows`` (item × window counts, or the
    file holding them) when they hold at least ``min_windows`` windows; else the frequency
    estimate. ``forecast`` is ``auto``, ``model`` (a learned one or bad input) or
    ``frequency``."""
    if forecast == "frequency" or windows is None:
        return None, "forecast: frequency"
    learned = _learned(windows, models_root, min_windows)
    if learned is None and forecast == "model":
        raise BadInputError("the learned forecast is unavailable", where=str(windows)[:200])
    if learned is None:
        return None, "forecast: frequency"
    return learned[0], f"forecast: model ({learned[1]})"


def _learned(
    windows: pd.DataFrame | Path, models_root: Path | None, min_windows: int
) -> tuple[dict[str, float], str] | None:
    try:
        from models.forecaster import HotnessForecaster
        from pipeline.evaluation import CountMatrix, latest_windows_that_fit

        counts = read_parquet_file(windows, "counts") if isinstance(windows, Path) else windows
        prefixes = counts[counts["item_kind"] == "prefix"]
        saved = saved_forecast(prefixes, models_root) if models_root is not None else None
        if saved is not None:
            return saved
        if prefixes["window_start"].nunique() < min_windows:
            return None
        latest, _ = latest_windows_that_fit(prefixes, "prefix")
        model = HotnessForecaster().fit(CountMatrix.from_counts(latest, kind="prefix"))
        return _prediction_map(model.predict_next(prefixes, kind="prefix")), "fitted"
    except (PrewarmError, ImportError, KeyError, ValueError, AttributeError) as exc:
        log.info("learned forecast unavailable (%s); using frequency", exc)
        return None


def plan_request(
    settings: Settings,
    engine_name: str,
    *,
    max_items: int | None = None,
    max_tokens: int | None = None,
    batch_size: int | None = None,
    shapes: bool = False,
    reason: str = PlanReason.CLI,
) -> PlanRequest:
    """The pure plan request for a configured engine, budgets overridable; ``reason`` is why
    the plan is made (:class:`pipeline.planner.reasons.PlanReason`)."""
    engine = settings.engine(engine_name)
    b = settings.budget
    budget = PlanBudget(
        max_items=max_items or b.max_items,
        max_tokens=max_tokens or b.max_tokens or usable_cache_tokens(engine),
        max_seconds=b.max_seconds,
        concurrency=engine.max_concurrency,
        batch_size=batch_size or b.batch_size,
        block_tokens=engine.cache_block_tokens,
    )
    cost = EngineCost(prefill_s_per_token=engine.prefill_s_per_token or DEFAULT_PREFILL_S_PER_TOKEN)
    return PlanRequest(
        engine=engine.name, model=engine.model, budget=budget, cost=cost,
        weights={t.name: t.weight for t in settings.tenants},
        shares={t.name: t.budget_share for t in settings.tenants},
        isolate_tenants=engine.tenant_isolation, window_s=settings.schedule.window_s,
        shapes=shapes, reason=plan_reason(reason),
    )  # fmt: skip


def gateway_candidates_noted(
    settings: Settings, engine_name: str, records: pd.DataFrame
) -> tuple[list[WarmItem], list[str], list[IntentWindow]]:
    """Candidates for the caches of the gateways in front of ``engine_name`` and notes for the
    plan. From its gateway request log (``[[sources]] kind = "litellm"``, prewarm's own
    requests left out): for an exact cache the requests clients repeat with deterministic
    parameters and the embeddings inputs they reuse; for a semantic cache the frequent
    intents (:mod:`tasks.services.intents`), with what the wrong-intent check found and each
    intent's requests and cache hits per window."""
    gateways = settings.gateways_of(engine_name)
    if not gateways or records.empty:
        return [], [], []
    users = records[~own_mask(records)]
    items: list[WarmItem] = []
    notes: list[str] = []
    windows: list[IntentWindow] = []
    for gateway in gateways:
        if gateway.cache == "semantic":
            # Imported here: intents load scikit-learn and the embedder torch, which a loop
            # without a semantic gateway never needs.
            from tasks.services.intents import find_intents

            found = find_intents(gateway, users, settings.schedule.window_s)
            items += found.items
            notes += found.notes
            windows += found.windows
        else:
            items += gateway_items(users, gateway.name, gateway.min_count)
    return items, notes, windows


def usable_cache_tokens(engine: EngineSettings) -> int | None:
    """What of an engine's ``cache_tokens`` can hold prefixes: vLLM keeps its first block as the
    null block (never cached), so with a known block size one block less."""
    if engine.cache_tokens is None or engine.kind != "vllm" or not engine.cache_block_tokens:
        return engine.cache_tokens
    return max(0, engine.cache_tokens - engine.cache_block_tokens)


def with_engine_cache(
    request: PlanRequest, cache: tuple[int, int] | None
) -> tuple[PlanRequest, str]:
    """``request`` within the cache the engine published (``vllm:cache_config_info``): its
    block size where the settings name none, and its real capacity (less vLLM's null block)
    as the most a plan fills — a ``cache_tokens`` setting or budget is a cap, never a belief:
    a plan larger than the real cache is cut to it, and the note says so. Without a published
    cache the request is as configured."""
    budget = request.budget
    if cache is None:
        return request, "cache: as configured (the engine publishes no cache size)"
    block, blocks = cache
    real = (blocks - 1) * block
    capacity = real if budget.max_tokens is None else min(budget.max_tokens, real)
    filled = replace(budget, block_tokens=budget.block_tokens or block, max_tokens=capacity)
    note = f"cache: {blocks} blocks of {block} tokens (the engine's /metrics)"
    if budget.max_tokens is not None and real < budget.max_tokens:
        note += (f"; smaller than the {budget.max_tokens} tokens configured: the plan is cut "
                 f"to the engine's {real}")  # fmt: skip
    return replace(request, budget=filled), note


#: Fewer requests with a prompt than this and workload profiles are not fitted (length buckets
#: name the shapes instead).
MIN_PROFILED = 50


def with_profiles(records: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """``records`` labelled with workload profiles (``models.profiles``): ``profile`` and
    ``profile_distance`` (to its centre), so each profile's representative is a shape item; and
    a note for the plan. Unchanged when there are too few requests or the fit fails."""
    usable = records[records["prompt"].notna()] if "prompt" in records.columns else records[:0]
    if len(usable) < MIN_PROFILED:
        return records, "shapes: length buckets (too few requests to profile)"
    # (imported only to fit: it loads scikit-learn and SciPy, 4.6 s of a gated replica's first
    # plan on a loaded 2-core machine, for a plan of too few requests to profile)
    from models.profiles import WorkloadProfiler

    try:
        profiler = WorkloadProfiler().fit(usable)
        labels = profiler.predict(usable)
        representatives = profiler.representatives(usable)
    except (PrewarmError, ValueError) as exc:
        log.info("workload profiles unavailable (%s); length buckets name the shapes", exc)
        return records, "shapes: length buckets (profiles unavailable)"
    out = records.copy()
    out["profile"] = pd.Series([None] * len(out), index=out.index, dtype="object")
    out.loc[usable.index, "profile"] = [f"profile-{k}" for k in labels]
    out["profile_distance"] = 1.0
    chosen = usable.index[[_row_of(usable, r) for r in representatives.to_dict("records")]]
    out.loc[chosen, "profile_distance"] = 0.0
    return out, f"shapes: {profiler.n_profiles_} workload profiles, one representative each"


def _row_of(frame: pd.DataFrame, row: dict[str, object]) -> int:
    """Position in ``frame`` of the representative ``row`` (same request id, else same prompt)."""
    for column in ("request_id", "prompt"):
        if column in frame.columns and row.get(column) is not None:
            hits = (frame[column] == row[column]).to_numpy().nonzero()[0]
            if len(hits):
                return int(hits[0])
    return 0


def plan_for(
    records: pd.DataFrame,
    request: PlanRequest,
    *,
    reason: str | None = None,
    windows: pd.DataFrame | Path | None = None,
    forecast: str = "auto",
    engine: EngineSettings | None = None,
    models_root: Path | None = None,
    min_windows: int = MIN_WINDOWS_FOR_MODEL,
    extra: Sequence[WarmItem] = (),
    detect: Detect = detect_prefixes,
) -> WarmPlan:
    """The one planning service every trigger calls: a plan for ``request.engine`` made for
    ``reason`` (a :class:`~pipeline.planner.reasons.PlanReason`; default the request's own).
    The forecaster is :func:`choose_forecast`'s (``forecast``: ``auto``, ``model`` or
    ``frequency``; ``windows``: the item × window counts, a frame or its file).

    With ``engine`` given, token counts are measured through its tokenizer before budgeting;
    with ``models_root`` (``<data_dir>/models``) a saved forecaster is preferred to fitting one.
    ``extra`` are candidates the caller knows of (template heads, a replica's configured
    adapters, a KV restore's held chains), scored with the rest; a ``template`` plan takes only
    those. A plan with shapes (``request.shapes`` or reason ``replica``) has one per workload
    profile. ``detect`` detects the records' prefixes
    (:class:`~pipeline.shared_prefixes.DetectedOnce`: one detection for the plans made from
    the same records).
    """
    if reason is not None:
        request = replace(request, reason=plan_reason(reason))
    predicted, note = choose_forecast(
        windows, models_root, forecast=forecast, min_windows=min_windows
    )
    notes = [note]
    if request.newest_since is not None:
        since = pd.Timestamp(request.newest_since, unit="s", tz="UTC").isoformat()
        notes.append(f"drift: windows from {since} weighted in full, older at "
                     f"{OLDER_WINDOW_WEIGHT}")  # fmt: skip
    if engine is not None:
        request, note = with_engine_cache(request, engine_cache(engine))
        notes.append(note)
    if request.shapes or request.reason == "replica":
        records, note = with_profiles(records)
        notes.append(note)
    items = candidates(records, request, predicted, extra=extra, detect=detect)
    counts = measure_tokens(items, engine) if engine is not None else {}
    plan = plan_from_candidates(items, request, token_counts=counts)
    notes.append(f"tokens: measured {len(counts)} by the engine" if counts else "tokens: estimated")
    return replace(plan, notes=(*plan.notes, *notes))
