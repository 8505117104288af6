"""Value checks and the base of every settings section, shared by the settings modules."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

#: Schemes of a ZMQ endpoint prewarm connects to (the engine binds it).
ZMQ_SCHEMES = ("tcp://", "ipc://", "inproc://")


class Section(BaseModel):
    """A settings section: unknown keys are refused, values never change after loading."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def no_control_characters(value: str) -> str:
    """``value`` unless it holds a control character (then ValueError)."""
    # A CR or LF in a URL would split an HTTP request line or a Redis command; httpx and
    # redis-py would refuse it later with a traceback, so it is refused here, naming the key.
    bad = next((c for c in value if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise ValueError(f"contains a control character ({bad!r}); URLs may not")
    return value


def http_url(value: str) -> str:
    """``value`` without its trailing ``/`` if it is an http(s) URL, else ValueError."""
    no_control_characters(value)
    if not value.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    return value.rstrip("/")


def redis_url(value: str | None) -> str | None:
    """A Redis URL (``redis://``, ``rediss://`` or ``unix://``), or None when not set."""
    if value is None:
        return None
    no_control_characters(value)
    if not value.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("must be a redis://, rediss:// or unix:// URL")
    return value


def zmq_endpoint(value: str) -> str:
    """``value`` if it is a ZMQ endpoint to connect to (``tcp://host:port``), else ValueError."""
    no_control_characters(value)
    if not value.startswith(ZMQ_SCHEMES):
        raise ValueError(f"must be a ZMQ endpoint (tcp://host:port), not {value!r}")
    if value.startswith("tcp://"):
        host, colon, port = value[len("tcp://") :].rpartition(":")
        if not (colon and host and host != "*" and port.isdigit()):
            raise ValueError(
                f"needs the host and port to connect to (tcp://host:port), not {value!r}"
            )
    return value
