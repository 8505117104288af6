"""One exception tree for prewarm.

Three families under one root: bad input (never retried; names the file, line or field),
transient (bounded retries with backoff) and consistency (fail loudly, alert).
"""

from __future__ import annotations


class PrewarmError(Exception):
    """Root of every error prewarm raises on purpose."""


class BadInputError(PrewarmError):
    """Input that can never succeed as given: a malformed file, a bad setting, a bad field.

    ``where`` names the file, line or field, so an operator can go straight to it.
    """

    def __init__(self, message: str, *, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class SettingsError(BadInputError):
    """A setting in the environment or the TOML file is missing or invalid."""


class TransientError(PrewarmError):
    """A failure that may pass on its own (engine 5xx, timeout, Redis failover): retry."""


class EngineUnavailableError(TransientError):
    """An engine did not answer, or answered with a retryable status."""


class ConsistencyError(PrewarmError):
    """State that must never happen (a WAL record without its transaction, a mixed cache)."""
