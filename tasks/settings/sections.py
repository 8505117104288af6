"""The sections of the settings file: engines, sources, repositories, budgets, the loop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, SecretStr, Tag, field_validator

from tasks.settings.values import Section as _Section
from tasks.settings.values import http_url as _http_url
from tasks.settings.values import no_control_characters as _no_control_characters
from tasks.settings.values import redis_url as _redis_url
from tasks.settings.values import zmq_endpoint


class EngineSettings(_Section):
    """One engine replica prewarm may warm. URLs come only from here, never from input data."""

    name: str
    url: str
    model: str
    kind: Literal["vllm", "llamacpp", "tgi", "simulator"] = "vllm"
    max_concurrency: int = Field(4, ge=1, le=256)
    cache_tokens: int | None = Field(None, ge=1)
    cache_block_tokens: int | None = Field(None, ge=1)
    prefill_s_per_token: float | None = Field(None, gt=0)
    tenant_isolation: bool = False
    adapters: tuple[str, ...] = ()
    #: the ``[[fleets]]`` entry this engine is a replica of (set by prewarm, not in the file)
    fleet: str | None = None
    #: its Prometheus endpoint, when not ``<url>/metrics``
    metrics_url: str | None = None

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return _http_url(value)

    @field_validator("metrics_url")
    @classmethod
    def _http_metrics_url(cls, value: str | None) -> str | None:
        return None if value is None else _http_url(value)


class TemplateRepoSettings(_Section):
    """A prompt-template git repository prewarm watches."""

    name: str
    url: str
    branch: str = "main"
    patterns: tuple[str, ...] = ("**/*.jinja", "**/*.j2", "**/tokenizer_config.json", "**/*.py")
    webhook_secret: SecretStr | None = None
    model: str | None = None

    @field_validator("url")
    @classmethod
    def _clean_url(cls, value: str) -> str:
        return _no_control_characters(value)


class BudgetSettings(_Section):
    """Limits on one warm-up plan."""

    max_items: int = Field(100, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    max_seconds: float = Field(60.0, gt=0)
    batch_size: int = Field(16, ge=1, le=10_000)


class ScheduleSettings(_Section):
    """Beat periods, in seconds."""

    window_s: int = Field(300, ge=1)
    retrain_s: int = Field(3600, ge=1)
    poll_repos_s: int = Field(60, ge=1)
    wal_sweep_s: int = Field(30, ge=1)
    replica_watch_s: int = Field(10, ge=1)
    #: the gate's looks at gated fleets' replicas (``gate = true``; nothing to do without)
    gate_watch_s: float = Field(1.0, gt=0)


#: Kinds of ``[[sources]]`` entry, each read by the reader registered for it
#: (``tasks.adapters.sources``).
SOURCE_KINDS = ("vllm-log", "tgi-log", "jsonl", "trace", "litellm")
#: The kind of ``[[sources]]`` entry that is an engine's KV-event stream (``prewarm kv-events``).
KV_EVENTS = "kv-events"


class SourceSettings(_Section):
    """Where one engine's served requests can be read (``[[sources]]``).

    ``path`` is a file, a folder (every file under it) or a glob; rotated and ``.gz`` files are
    read as ingest reads them. ``year``/``tz`` are vLLM's missing timestamp parts.
    """

    engine: str
    kind: str
    path: str
    tz: str = "UTC"
    year: int | None = None
    #: the fleet whose replica this source was made for (set by prewarm, not in the file)
    fleet: str | None = None

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value not in SOURCE_KINDS:
            known = ", ".join((*SOURCE_KINDS, KV_EVENTS))
            raise ValueError(f"unknown source kind {value!r}; known: {known}")
        return value


class KvEventSourceSettings(_Section):
    """An engine's KV-cache event stream (``[[sources]] kind = "kv-events"``), followed by the
    ``prewarm kv-events`` service: vLLM's ZMQ publisher (``endpoint``, its
    ``--kv-events-config`` ``endpoint`` as prewarm reaches it), its replay socket
    (``replay_endpoint``, to fill gaps) and the topic it publishes on."""

    engine: str
    kind: Literal["kv-events"] = "kv-events"
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    #: the fleet whose replica this stream was made for (set by prewarm, not in the file)
    fleet: str | None = None

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq(cls, value: str | None) -> str | None:
        return None if value is None else zmq_endpoint(value)


def _source_kind(value: Any) -> str:
    kind = value.get("kind") if isinstance(value, Mapping) else getattr(value, "kind", None)
    return KV_EVENTS if kind == KV_EVENTS else "file"


#: A ``[[sources]]`` entry: files the loop reads, or a KV-event stream.
AnySource = Annotated[
    Annotated[SourceSettings, Tag("file")] | Annotated[KvEventSourceSettings, Tag(KV_EVENTS)],
    Discriminator(_source_kind),
]


#: Fewer windows of history than this and a learned model has nothing to learn from.
MIN_WINDOWS_FOR_MODEL = 8


class LoopSettings(_Section):
    """The warm-up loop (``[loop]``): how much of the observations it keeps and plans from."""

    #: windows of item counts kept per engine (the forecaster's history)
    keep_windows: int = Field(2016, ge=8)
    #: recent request records kept per engine (the planner's candidates)
    keep_records: int = Field(20_000, ge=100)
    #: windows of counts before a forecaster is fitted and saved for an engine (the one
    #: threshold: below it every plan uses the frequency estimate)
    min_windows_for_model: int = Field(MIN_WINDOWS_FOR_MODEL, ge=2)
    #: what the forecaster's backtest scores: next-window ``requests`` on the warmed items, or
    #: ``first_uses`` (items used at all: what a warm-up after a restart saves)
    selection_metric: Literal["requests", "first_uses"] = "requests"
    #: plans kept in the store per engine (older ones are deleted with their keys)
    keep_plans: int = Field(8, ge=1)


class TopicSettings(_Section):
    """Topic drift (``[topics]``): prompts embedded with all-MiniLM-L6-v2 (the ``models``
    extra), grouped in topics per engine, and a window whose topic mix moved against the
    windows before it fires the loop's ``topic_drift`` trigger."""

    #: off by default: it loads torch and the embedding model into every loop worker
    #: (about 20 s and 500 MiB once per process)
    enabled: bool = False
    #: prompts of each window that are embedded (the embedding cost's bound)
    sample_per_window: int = Field(64, ge=8)
    #: topics fitted per engine (MiniBatchKMeans), besides ``unseen``
    n_topics: int = Field(4, ge=2)
    #: windows pooled as the baseline a window's topic mix is compared with
    baseline_windows: int = Field(4, ge=2)
    #: windows after a drift during which plans weight the newest windows
    weight_windows: int = Field(6, ge=1)


class TenantSettings(_Section):
    """A tenant's SLA weight and share of the warm-up budget."""

    name: str
    weight: float = Field(1.0, gt=0)
    budget_share: float = Field(1.0, gt=0, le=1)


#: Seconds a warm-up batch's metrics wait in its worker before they are written (the default).
METRICS_FLUSH_S = 1.0


class GatewaySettings(_Section):
    """A gateway in front of an engine that caches responses and embeddings (``[[gateways]]``):
    LiteLLM's proxy at ``url``, called with ``key`` (its master key or a virtual key), caching
    in the Redis at ``cache_url`` under ``namespace`` for ``ttl_s`` seconds, as the operator
    set them in the proxy's ``cache_params``. ``engine`` names the engine whose traffic it
    fronts (its ``[[sources]] kind = "litellm"`` log feeds that engine's loop); the loop warms
    the requests asked at least ``min_count`` times with deterministic parameters, and the
    embeddings inputs used as often, through the proxy. A ``semantic`` cache is warmed by
    intent instead (``docs/pages/semantic.md``)."""

    name: str
    kind: Literal["litellm"] = "litellm"
    url: str
    engine: str
    key: SecretStr | None = None
    cache_url: str | None = None
    namespace: str | None = None
    ttl_s: int | None = Field(None, ge=1)
    min_count: int = Field(2, ge=1)
    timeout_s: float = Field(30.0, gt=0)
    #: ``exact`` (LiteLLM's ``redis`` cache: repeated requests) or ``semantic`` (its
    #: ``redis-semantic`` cache: frequent intents, by meaning)
    cache: Literal["exact", "semantic"] = "exact"
    #: the proxy's ``similarity_threshold`` (a semantic cache answers at this cosine or more)
    similarity_threshold: float = Field(0.9, gt=0, le=1)
    #: the proxy's ``redis_semantic_cache_embedding_model`` (a model group of the proxy):
    #: the collision check embeds through the gateway with it
    embedding_model: str | None = None
    #: the proxy's ``redis_semantic_cache_index_name`` (where its entries are found to undo)
    semantic_index: str = "litellm_semantic_cache_index"
    #: other intents' prompts sent after warming an intent, which must not hit its entry
    probes: int = Field(3, ge=0)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return _http_url(value)

    @field_validator("cache_url")
    @classmethod
    def _cache_redis_url(cls, value: str | None) -> str | None:
        return _redis_url(value)
