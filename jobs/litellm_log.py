"""LiteLLM's request log for prewarm: a logging callback operators add to their proxy's config.

::

    litellm_settings:
      callbacks: ["jobs.litellm_log.request_log"]

The proxy (``pip install 'prewarm[litellm]'`` in its environment) then appends one JSON line per
request to the file named by ``PREWARM_LITELLM_LOG`` (default ``litellm-requests.jsonl`` in its
working directory): the request as the client sent it (its OpenAI parameters, less
``metadata``), the model group, the deployment that served it, whether LiteLLM's cache answered
and under which key, token counts and times. prewarm reads the file as a ``[[sources]]`` entry
of kind ``litellm`` (format ``litellm-jsonl``, :mod:`pipeline.ingest.formats.litellm_jsonl`).

This module imports LiteLLM, so only the proxy's process imports it; nothing in prewarm does.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

from pipeline.gateway_log import LOG_TAG, endpoint_of, request_body
from tasks.settings import litellm_log_path

#: request headers the log keeps: the request id (prewarm's own warm-ups carry ``prewarm-…``)
_REQUEST_ID_HEADERS = ("x-request-id", "x-litellm-request-id")


class PrewarmRequestLog(CustomLogger):
    """Appends one line per request the proxy answered (or failed) to prewarm's log file."""

    def __init__(self, path: Path | None = None) -> None:
        super().__init__()
        self._path = path
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        if self._path is None:  # read when the proxy first logs, never at import
            self._path = litellm_log_path()
        return self._path

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        """LiteLLM's hook for an answered request (from its cache or from the engine)."""
        self._write(kwargs, "success")

    async def async_log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        """LiteLLM's hook for a failed request."""
        self._write(kwargs, "failure")

    def _write(self, kwargs: dict[str, Any], status: str) -> None:
        line = json.dumps(log_line(kwargs, status), default=str, separators=(",", ":")) + "\n"
        data = line.encode()
        with self._lock:
            # One write of the whole line in append mode: lines of several proxy workers never
            # interleave inside a line (Linux appends a regular file's write as one piece).
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)


def log_line(kwargs: dict[str, Any], status: str) -> dict[str, Any]:
    """The log line of one request from what LiteLLM hands its callbacks."""
    payload: dict[str, Any] = kwargs.get("standard_logging_object") or {}
    params = kwargs.get("litellm_params") or {}
    server = params.get("proxy_server_request") or {}
    headers = {str(k).lower(): v for k, v in (server.get("headers") or {}).items()}
    body = request_body(server.get("body") or _body_from(kwargs, payload))
    return {
        "log": LOG_TAG,
        "ts": payload.get("startTime"),
        "request_id": _request_id(headers, payload),
        "endpoint": endpoint_of(str(payload.get("call_type") or kwargs.get("call_type") or "")),
        "model": payload.get("model_group") or body.get("model"),
        "deployment": payload.get("model_id") or payload.get("api_base"),
        "request": body,
        "cache_hit": bool(payload.get("cache_hit")),
        "cache_key": payload.get("cache_key"),
        "prompt_tokens": payload.get("prompt_tokens"),
        "output_tokens": payload.get("completion_tokens"),
        "e2e_s": payload.get("response_time"),
        "status": status,
    }


def _request_id(headers: dict[str, Any], payload: dict[str, Any]) -> Any:
    """The client's request id where it sent one (prewarm's warm-ups do), else LiteLLM's."""
    return next((headers[h] for h in _REQUEST_ID_HEADERS if headers.get(h)), payload.get("id"))


def _body_from(kwargs: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """The request rebuilt from the payload when the proxy's own copy is missing (an SDK
    caller): the model group, the messages or input, and the OpenAI parameters."""
    body: dict[str, Any] = {"model": payload.get("model_group") or kwargs.get("model")}
    body.update(payload.get("model_parameters") or {})
    if kwargs.get("messages") is not None:
        body["messages"] = kwargs["messages"]
    if kwargs.get("input") is not None:
        body["input"] = kwargs["input"]
    return body


#: The instance the proxy's config names (``callbacks: ["jobs.litellm_log.request_log"]``).
request_log = PrewarmRequestLog()
