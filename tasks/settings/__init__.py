"""Settings: the only module that reads the environment.

Values come from ``PREWARM_*`` environment variables and an optional TOML file
(``PREWARM_CONFIG``, or ``--config`` on the CLI). The environment wins over the file.
Invalid settings raise :class:`SettingsError` naming the key and what was wrong.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline.errors import SettingsError
from tasks.settings.fleets import FleetSettings, replica_entries, replica_name
from tasks.settings.sections import (
    KV_EVENTS,
    METRICS_FLUSH_S,
    MIN_WINDOWS_FOR_MODEL,
    SOURCE_KINDS,
    AnySource,
    BudgetSettings,
    EngineSettings,
    GatewaySettings,
    KvEventSourceSettings,
    LoopSettings,
    ScheduleSettings,
    SourceSettings,
    TemplateRepoSettings,
    TenantSettings,
    TopicSettings,
)
from tasks.settings.values import ZMQ_SCHEMES, zmq_endpoint
from tasks.settings.values import Section as _Section
from tasks.settings.values import no_control_characters as _no_control_characters
from tasks.settings.values import redis_url as _redis_url

ENV_PREFIX = "PREWARM_"


class Settings(_Section):
    """Everything prewarm can be configured with."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    result_url: str | None = None
    # prewarm's own state (WAL, plans, telemetry, de-duplication); defaults to the broker's Redis.
    store_url: str | None = None
    # shared state (observations, models, KV-event counts): a folder or an fsspec URL such as
    # ``s3://bucket/prefix`` (tasks.adapters.shared_store); host-local things (template-repository
    # clones, ingest parts, temporary copies) go under ``local_dir``, by default ``data_dir``
    # itself when it is a folder and ``.prewarm-local`` when it is a bucket
    data_dir: str = ".prewarm"
    local_dir: Path | None = None
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
    topics: TopicSettings = TopicSettings()
    fleets: tuple[FleetSettings, ...] = ()

    @field_validator("result_url")
    @classmethod
    def _clean_result_url(cls, value: str | None) -> str | None:
        # Any Celery result backend URL; only control characters are refused.
        return None if value is None else _no_control_characters(value)

    @field_validator("data_dir", mode="before")
    @classmethod
    def _data_dir_text(cls, value: object) -> object:
        return str(value) if isinstance(value, Path) else value

    @property
    def host_dir(self) -> Path:
        """This host's own folder (clones, temporary copies): never shared with another host."""
        if self.local_dir is not None:
            return self.local_dir
        return Path(".prewarm-local") if "://" in self.data_dir else Path(self.data_dir)

    @field_validator("redis_url", "store_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        return _redis_url(value)

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
        known |= {replica_name(f, r.url, r.name) for f in self.fleets for r in f.replicas}
        for n, source in enumerate(self.sources):
            if source.engine not in known:
                raise ValueError(f"sources[{n}]: engine {source.engine!r} is not configured")
        streams = [s.engine for s in self.sources if isinstance(s, KvEventSourceSettings)]
        twice = sorted({engine for engine in streams if streams.count(engine) > 1})
        if twice:
            raise ValueError(f"sources: more than one kv-events source for engine {twice[0]!r}")
        for n, gateway in enumerate(self.gateways):
            if gateway.engine not in known:
                raise ValueError(f"gateways[{n}]: engine {gateway.engine!r} is not configured")
        names = [g.name for g in self.gateways]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"gateways: the name {twice[0]!r} is used twice")
        return self

    @model_validator(mode="after")
    def _fleet_names_are_new(self) -> Settings:
        names = [fleet.name for fleet in self.fleets]
        engines = {engine.name for engine in self.engines if engine.fleet is None}
        for n, name in enumerate(names):
            if name in names[:n] or name in engines:
                raise ValueError(f"fleets[{n}]: name {name!r} is taken (a fleet or an engine)")
        return self

    @model_validator(mode="after")
    def _fleet_replicas_are_engines(self) -> Settings:
        if self.fleets:
            try:
                engines, sources = self._with_replicas({})
            except SettingsError as exc:
                raise ValueError(str(exc)) from exc
            # (a frozen model's fields are set once, here, while it is being validated: a
            # validator that returned a copy would be ignored when built by __init__)
            self.__dict__.update(engines=engines, sources=sources)
        return self

    def with_members(self, members: Mapping[str, Sequence[str]]) -> Settings:
        """These settings with each fleet's replicas as engines (and their logs and KV-event
        streams as sources): the listed ones, and, for a fleet that takes them from its router,
        the worker URLs ``members`` gives for it (none known yet: none)."""
        engines, sources = self._with_replicas(members)
        return self.model_copy(update={"engines": engines, "sources": sources})

    def _with_replicas(
        self, members: Mapping[str, Sequence[str]]
    ) -> tuple[tuple[EngineSettings, ...], tuple[AnySource, ...]]:
        engines = [e for e in self.engines if e.fleet is None]
        sources = [s for s in self.sources if s.fleet is None]
        taken = {e.name for e in engines}
        for n, fleet in enumerate(self.fleets):
            urls = members.get(fleet.name, ()) if fleet.discovered else None
            made, own = replica_entries(fleet, urls)
            for entry in made:
                if entry["name"] in taken:
                    raise SettingsError(
                        f"replica {entry['name']!r} is also an engine", where=f"fleets.{n}"
                    )
                taken.add(entry["name"])
                engines.append(EngineSettings.model_validate(entry))
            sources += [
                KvEventSourceSettings.model_validate(s) if s["kind"] == KV_EVENTS
                else SourceSettings.model_validate(s) for s in own
            ]  # fmt: skip
        return tuple(engines), tuple(sources)

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

    def fleet(self, name: str) -> FleetSettings:
        """The ``[[fleets]]`` entry called ``name``; unknown names are bad input."""
        for fleet in self.fleets:
            if fleet.name == name:
                return fleet
        known = ", ".join(f.name for f in self.fleets) or "none configured"
        raise SettingsError(f"unknown fleet {name!r} (known: {known})", where="fleets")

    def replicas_of(self, fleet: str) -> tuple[EngineSettings, ...]:
        """The engines that are ``fleet``'s replicas now."""
        return tuple(engine for engine in self.engines if engine.fleet == fleet)

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
    "local_dir",
    "log_level",
    "visibility_timeout_s",
    "wal_lease_s",
    "api_host",
    "api_port",
    "metrics_flush_s",
)


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


#: Where prewarm's LiteLLM callback (``jobs.litellm_log``) appends its request log.
LITELLM_LOG_ENV = ENV_PREFIX + "LITELLM_LOG"


def litellm_log_path(environ: Mapping[str, str] | None = None) -> Path:
    """The file the LiteLLM callback writes (``PREWARM_LITELLM_LOG``, read in the proxy's
    process; default ``litellm-requests.jsonl`` in its working directory)."""
    environ = os.environ if environ is None else environ
    return Path(environ.get(LITELLM_LOG_ENV) or "litellm-requests.jsonl")


__all__ = [
    "ENV_PREFIX",
    "KV_EVENTS",
    "LITELLM_LOG_ENV",
    "METRICS_FLUSH_S",
    "MIN_WINDOWS_FOR_MODEL",
    "SOURCE_KINDS",
    "ZMQ_SCHEMES",
    "AnySource",
    "BudgetSettings",
    "EngineSettings",
    "FleetSettings",
    "GatewaySettings",
    "KvEventSourceSettings",
    "LoopSettings",
    "ScheduleSettings",
    "Settings",
    "SourceSettings",
    "TemplateRepoSettings",
    "TenantSettings",
    "TopicSettings",
    "current_settings",
    "litellm_log_path",
    "load_settings",
    "read_config_file",
    "zmq_endpoint",
]
