"""Settings: the only module that reads the environment.

Values come from ``PREWARM_*`` environment variables and an optional TOML file
(``PREWARM_CONFIG``, or ``--config`` on the CLI). The environment wins over the file.
Invalid settings raise :class:`SettingsError` naming the key and what was wrong.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline.errors import SettingsError

ENV_PREFIX = "PREWARM_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _no_control_characters(value: str) -> str:
    # A CR or LF in a URL would split an HTTP request line or a Redis command; httpx and
    # redis-py would refuse it later with a traceback, so it is refused here, naming the key.
    bad = next((c for c in value if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise ValueError(f"contains a control character ({bad!r}); URLs may not")
    return value


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

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        _no_control_characters(value)
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")


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


#: Kinds of ``[[sources]]`` entry, each read by the reader registered for it
#: (``tasks.adapters.sources``).
SOURCE_KINDS = ("vllm-log", "tgi-log", "jsonl", "trace", "litellm")
#: The kind of ``[[sources]]`` entry that is an engine's KV-event stream (``prewarm kv-events``).
KV_EVENTS = "kv-events"
#: Schemes of a ZMQ endpoint prewarm connects to (the engine binds it).
ZMQ_SCHEMES = ("tcp://", "ipc://", "inproc://")


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

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value not in SOURCE_KINDS:
            known = ", ".join((*SOURCE_KINDS, KV_EVENTS))
            raise ValueError(f"unknown source kind {value!r}; known: {known}")
        return value


def zmq_endpoint(value: str) -> str:
    """``value`` if it is a ZMQ endpoint to connect to (``tcp://host:port``), else ValueError."""
    _no_control_characters(value)
    if not value.startswith(ZMQ_SCHEMES):
        raise ValueError(f"must be a ZMQ endpoint (tcp://host:port), not {value!r}")
    if value.startswith("tcp://"):
        host, colon, port = value[len("tcp://") :].rpartition(":")
        if not (colon and host and host != "*" and port.isdigit()):
            raise ValueError(
                f"needs the host and port to connect to (tcp://host:port), not {value!r}"
            )
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


class GatewaySettings(_Section):
    """A gateway in front of an engine that caches responses and embeddings (``[[gateways]]``):
    LiteLLM's proxy at ``url``, called with ``key`` (its master key or a virtual key), caching
    in the Redis at ``cache_url`` under ``namespace`` for ``ttl_s`` seconds, as the operator
    set them in the proxy's ``cache_params``. ``engine`` names the engine whose traffic it
    fronts (its ``[[sources]] kind = "litellm"`` log feeds that engine's loop); the loop warms
    the requests asked at least ``min_count`` times with deterministic parameters, and the
    embeddings inputs used as often, through the proxy."""

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

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        _no_control_characters(value)
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("cache_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        _no_control_characters(value)
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return value


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


class TenantSettings(_Section):
    """A tenant's SLA weight and share of the warm-up budget."""

    name: str
    weight: float = Field(1.0, gt=0)
    budget_share: float = Field(1.0, gt=0, le=1)


#: Seconds a warm-up batch's metrics wait in its worker before they are written (the default).
METRICS_FLUSH_S = 1.0


class Settings(_Section):
    """Everything prewarm can be configured with."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    result_url: str | None = None
    # prewarm's own state (WAL, plans, telemetry, de-duplication); defaults to the broker's Redis.
    store_url: str | None = None
    data_dir: Path = Path(".prewarm")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # Chosen together: a plan whose worker died resumes within one lease plus one sweep
    # (tasks.warm_tasks); the broker's visibility timeout only re-delivers the lost message later,
    # and must outlast the longest batch and a retry's countdown of three leases.
    visibility_timeout_s: int = Field(900, ge=60)
    wal_lease_s: int = Field(30, ge=1)
    api_host: str = "127.0.0.1"
    api_port: int = Field(8080, ge=1, le=65535)
    # how long a batch's metrics wait in its worker, summed with the batches after it, before
    # they are written (tasks.adapters.telemetry); 0 writes each batch's as it ends
    metrics_flush_s: float = Field(METRICS_FLUSH_S, ge=0, le=60)
    engines: tuple[EngineSettings, ...] = ()
    template_repos: tuple[TemplateRepoSettings, ...] = ()
    budget: BudgetSettings = BudgetSettings()
    schedule: ScheduleSettings = ScheduleSettings()
    tenants: tuple[TenantSettings, ...] = ()
    sources: tuple[AnySource, ...] = ()
    loop: LoopSettings = LoopSettings()
    gateways: tuple[GatewaySettings, ...] = ()

    @field_validator("result_url")
    @classmethod
    def _clean_result_url(cls, value: str | None) -> str | None:
        # Any Celery result backend URL; only control characters are refused.
        return None if value is None else _no_control_characters(value)

    @field_validator("redis_url", "store_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value is None:
            return None
        _no_control_characters(value)
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return value

    @model_validator(mode="after")
    def _visibility_outlasts_leases(self) -> Settings:
        if self.visibility_timeout_s < 10 * self.wal_lease_s:
            raise ValueError(
                f"visibility_timeout_s ({self.visibility_timeout_s}) must be at least 10 × "
                f"wal_lease_s ({self.wal_lease_s}): a batch retried after three leases must "
                "not be redelivered while it waits"
            )
        return self

    @model_validator(mode="after")
    def _sources_name_engines(self) -> Settings:
        known = {engine.name for engine in self.engines}
        for n, source in enumerate(self.sources):
            if source.engine not in known:
                raise ValueError(f"sources[{n}]: engine {source.engine!r} is not configured")
        for n, gateway in enumerate(self.gateways):
            if gateway.engine not in known:
                raise ValueError(f"gateways[{n}]: engine {gateway.engine!r} is not configured")
        names = [g.name for g in self.gateways]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"gateways: the name {twice[0]!r} is used twice")
        streams = [s.engine for s in self.sources if isinstance(s, KvEventSourceSettings)]
        twice = sorted({engine for engine in streams if streams.count(engine) > 1})
        if twice:
            raise ValueError(f"sources: more than one kv-events source for engine {twice[0]!r}")
        return self

    @property
    def store_redis_url(self) -> str:
        """Redis URL of prewarm's own state."""
        return self.store_url or self.redis_url

    def engine(self, name: str) -> EngineSettings:
        """The configured engine called ``name``; unknown names are bad input."""
        for engine in self.engines:
            if engine.name == name:
                return engine
        known = ", ".join(e.name for e in self.engines) or "none configured"
        raise SettingsError(f"unknown engine {name!r} (known: {known})", where="engines")

    def sources_of(self, engine: str) -> tuple[SourceSettings, ...]:
        """The ``[[sources]]`` files that feed ``engine`` (what the loop reads)."""
        return tuple(
            source
            for source in self.sources
            if isinstance(source, SourceSettings) and source.engine == engine
        )

    def gateways_of(self, engine: str) -> tuple[GatewaySettings, ...]:
        """The ``[[gateways]]`` in front of ``engine`` (their entries are warmed by its loop)."""
        return tuple(g for g in self.gateways if g.engine == engine)

    def gateway(self, name: str) -> GatewaySettings:
        """The configured gateway called ``name``; unknown names are bad input."""
        for gateway in self.gateways:
            if gateway.name == name:
                return gateway
        known = ", ".join(g.name for g in self.gateways) or "none configured"
        raise SettingsError(f"unknown gateway {name!r} (known: {known})", where="gateways")

    def kv_events_of(self, engine: str) -> KvEventSourceSettings | None:
        """``engine``'s KV-event stream (``[[sources]] kind = "kv-events"``), if configured."""
        return next(
            (
                source
                for source in self.sources
                if isinstance(source, KvEventSourceSettings) and source.engine == engine
            ),
            None,
        )


# Scalar settings that may come from the environment, and how each is named there.
_ENV_KEYS = (
    "redis_url",
    "result_url",
    "store_url",
    "data_dir",
    "log_level",
    "visibility_timeout_s",
    "wal_lease_s",
    "api_host",
    "api_port",
    "metrics_flush_s",
)


#: Where prewarm's LiteLLM callback (``jobs.litellm_log``) appends its request log.
LITELLM_LOG_ENV = ENV_PREFIX + "LITELLM_LOG"


def litellm_log_path(environ: Mapping[str, str] | None = None) -> Path:
    """The file the LiteLLM callback writes (``PREWARM_LITELLM_LOG``, read in the proxy's
    process; default ``litellm-requests.jsonl`` in its working directory)."""
    environ = os.environ if environ is None else environ
    return Path(environ.get(LITELLM_LOG_ENV) or "litellm-requests.jsonl")


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse a TOML settings file; a missing or malformed file is a :class:`SettingsError`."""
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError as exc:
        raise SettingsError("config file not found", where=str(path)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"not valid TOML ({exc})", where=str(path)) from exc


def _from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key in _ENV_KEYS:
        env_name = ENV_PREFIX + key.upper()
        if env_name in environ:
            values[key] = environ[env_name]
    return values


#: the tags of the kinds of ``[[sources]]`` entry, which pydantic puts in an error's location
_SOURCE_TAGS = ("file", KV_EVENTS)


def _describe(error: ValidationError, origin: str) -> str:
    first = error.errors()[0]
    loc = first["loc"]
    parts = [
        str(part)
        for i, part in enumerate(loc)
        if not (part in _SOURCE_TAGS and i >= 2 and loc[i - 2] == "sources")
    ]
    key = ".".join(parts) or "(top level)"
    return f"{origin}: setting {key!r}: {first['msg']}"


def load_settings(
    environ: Mapping[str, str] | None = None, config_path: Path | str | None = None
) -> Settings:
    """Build :class:`Settings` from a TOML file (``PREWARM_CONFIG`` or ``config_path``) and env."""
    environ = os.environ if environ is None else environ
    path = config_path or environ.get(ENV_PREFIX + "CONFIG")
    values: dict[str, Any] = read_config_file(Path(path)) if path else {}
    values.update(_from_env(environ))
    origin = str(path) if path else "environment"
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        raise SettingsError(_describe(exc, origin)) from exc


@lru_cache(maxsize=1)
def _settings_at(path: str | None, stamp: tuple[float, int] | None) -> Settings:
    return load_settings()


def _file_stamp(path: str | None) -> tuple[float, int] | None:
    if not path:
        return None
    try:
        info = os.stat(path)
    except OSError:  # gone: load_settings names the missing file
        return None
    return (info.st_mtime, info.st_size)


class _CurrentSettings:
    """Settings of this process: read on first use (never at import time), and read again when
    the TOML file changed since (its modification time or size), so a long-running service
    sees a new engine, source or repository at its next tick without a restart."""

    def __call__(self) -> Settings:
        path = os.environ.get(ENV_PREFIX + "CONFIG")
        return _settings_at(path, _file_stamp(path))

    def cache_clear(self) -> None:
        """Forget the settings read (tests that change the environment call this)."""
        _settings_at.cache_clear()


current_settings = _CurrentSettings()
