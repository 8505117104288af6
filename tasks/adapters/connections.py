"""Reaching Redis and engines from the command line and services, with errors a user can read.

Third-party connection errors (redis-py, kombu, httpx) are translated here, at the edge, into
prewarm's own tree, so ``prewarm`` prints one line naming what it could not reach.
"""

from __future__ import annotations

import functools
import logging
import re
import ssl
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import kombu.exceptions
import redis

from pipeline.errors import BadInputError, EngineUnavailableError, PrewarmError, TransientError
from tasks.adapters import redis_keys
from tasks.settings import Settings

BEAT_HEARTBEAT_KEY = redis_keys.BEAT_HEARTBEAT


class RedisUnavailableError(TransientError):
    """Redis (broker or prewarm's store) did not answer."""


_USERINFO = re.compile(r"(?<=//)[^/?#]*@")


def redacted(url: str) -> str:
    """``url`` with its password masked (``user:***@``), for messages and logs.

    A user without a password is masked whole (``***@``): a lone user part is often a token.
    Malformed URLs are masked too, by the part between ``//`` and the last ``@``.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return _USERINFO.sub("***@", url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url
    user, colon, _ = userinfo.partition(":")
    masked = f"{user}:***" if colon else "***"
    return urlunsplit(parts._replace(netloc=f"{masked}@{host}"))


# A URL's user part inside free text: scheme, then everything up to the last '@' of the
# authority (no '/', whitespace, quote or '@' before it).
_URL_IN_TEXT = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)([^/\s@'\"<>]+)@")


def redact_text(text: str) -> str:
    """Every URL in ``text`` with its password masked (as :func:`redacted` shows one URL)."""
    if "://" not in text or "@" not in text:
        return text

    def mask(match: re.Match[str]) -> str:
        user, colon, _ = match.group(2).partition(":")
        return match.group(1) + (f"{user}:***@" if colon else "***@")

    return _URL_IN_TEXT.sub(mask, text)


def redact_logged_urls() -> None:
    """Mask URL passwords in every log record of this process (httpx logs each request's full
    URL at INFO, user and password included). Installed once; repeating it is harmless."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "redacts_urls", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed call; logging reports it later
            return record
        masked = redact_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        return record

    factory.redacts_urls = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0].rstrip(".")


def redis_unavailable(url: str, exc: BaseException, role: str = "Redis") -> RedisUnavailableError:
    """The one-line error for a Redis at ``url`` that could not be reached."""
    return RedisUnavailableError(
        f"cannot reach {role} at {redacted(url)} ({_reason(exc)}); start Redis there "
        "or set PREWARM_REDIS_URL"
    )


def ping_redis(url: str, *, role: str = "Redis", timeout_s: float = 2.0) -> None:
    """Raise :class:`RedisUnavailableError` unless the Redis at ``url`` answers PING."""
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        raise redis_unavailable(url, exc, role) from exc
    except redis.ResponseError as exc:  # e.g. NOAUTH: reachable but refusing us
        raise RedisUnavailableError(
            f"{role} at {redacted(url)} refused PING ({_reason(exc)})"
        ) from exc
    finally:
        client.close()


def check_settings_redis(settings: Settings) -> None:
    """Ping the broker and, when it is another server, prewarm's store."""
    ping_redis(settings.redis_url, role="the Redis broker")
    if settings.store_redis_url != settings.redis_url:
        ping_redis(settings.store_redis_url, role="the Redis store")


def translate_connection_error(
    exc: BaseException, settings: Settings | None = None
) -> PrewarmError | None:
    """prewarm's error for a third-party connection failure, or ``None`` for anything else."""
    url = settings.redis_url if settings else "the configured Redis"
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return redis_unavailable(url, exc)
    if isinstance(exc, kombu.exceptions.OperationalError):
        return redis_unavailable(url, exc, "the broker")
    if isinstance(exc, httpx.TransportError):
        where = redacted(str(exc.request.url)) if _has_request(exc) else "an engine"
        return EngineUnavailableError(f"cannot reach {where} ({_reason(exc)})")
    return None


def _has_request(exc: httpx.TransportError) -> bool:
    try:
        exc.request  # noqa: B018 - the property raises when the error carries no request
    except RuntimeError:
        return False
    return True


def record_beat_heartbeat(url: str, ttl_s: int = 600) -> None:
    """Note that beat ticked now (read by ``prewarm health beat``)."""
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.set(BEAT_HEARTBEAT_KEY, f"{time.time():.3f}", ex=ttl_s)
    finally:
        client.close()


def beat_heartbeat_age(url: str) -> float | None:
    """Seconds since beat last ticked, or ``None`` if it never did (or the key expired)."""
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        value: Any = client.get(BEAT_HEARTBEAT_KEY)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise redis_unavailable(url, exc) from exc
    finally:
        client.close()
    return None if value is None else time.time() - float(value)


def check_engine_url(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """``/health`` and ``/v1/models`` of the engine at ``url``; raises if it does not answer.

    Every message names the URL with its password masked (:func:`redacted`).
    """
    shown = redacted(url)
    try:
        with httpx.Client(base_url=url, timeout=timeout_s, verify=tls_context()) as client:
            health = client.get("/health")
            models = client.get("/v1/models")
    except httpx.InvalidURL as exc:
        raise BadInputError(f"not a usable URL ({_reason(exc)})", where=shown) from exc
    except httpx.TransportError as exc:
        raise EngineUnavailableError(f"cannot reach engine at {shown} ({_reason(exc)})") from exc
    if health.status_code != 200 or models.status_code != 200:
        raise EngineUnavailableError(
            f"engine at {shown} is not healthy (/health {health.status_code}, "
            f"/v1/models {models.status_code})"
        )
    try:
        cards = models.json().get("data", [])
        names = [card.get("id") for card in cards if isinstance(card, dict)]
    except (ValueError, AttributeError) as exc:
        raise EngineUnavailableError(f"engine at {shown}: /v1/models is not a model list") from exc
    return {"url": shown, "models": names}


def http_get(url: str, timeout_s: float) -> httpx.Response:
    """GET ``url`` once (a health check); a bad URL is bad input, no answer is transient."""
    try:
        return httpx.get(url, timeout=timeout_s)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
        raise BadInputError(f"not a usable URL ({exc})", where=redacted(url)) from exc
    except httpx.TransportError as exc:
        raise TransientError(f"cannot reach {redacted(url)} ({exc})") from exc


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The TLS context every HTTP client of this process verifies with, built once: httpx
    builds one per client otherwise, loading the system's CA bundle each time (140 ms per
    client on a loaded 2-core machine: nine of them were most of a gated replica's 1.2 s of
    prewarm's part, all to reach plain-HTTP engines on loopback). The same context httpx
    builds (certifi's bundle, or ``SSL_CERT_FILE``/``SSL_CERT_DIR``)."""
    return httpx.create_ssl_context()
