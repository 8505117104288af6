"""Request logs in the format of a current vLLM API server (0.32, as captured from a real one).

Lines follow ``../shared/data/logs/FORMATS.md`` §1 and ``tests/data/vllm-0.32-cpu-debug.log``:
the ``(APIServer pid=N)`` tag on vLLM's own lines (uvicorn's lines have their own formatter and
no tag), ``%m-%d %H:%M:%S`` timestamps in UTC, and, because request prompts are only printed at
DEBUG (``--enable-log-requests`` with ``VLLM_LOGGING_LEVEL=DEBUG``), shortened package-relative
file info. Every run starts with a banner saying the server is the prewarm engine SIMULATOR, so
its logs are never mistaken for a real engine's.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from pipeline.errors import BadInputError

# Source locations a current vLLM prints for these lines (DEBUG: package-relative paths).
_REQUEST_LOGGER = "entrypoints/.../utils/request_logger.py"
_BODY_AT = f"{_REQUEST_LOGGER}:74"
_DETAILS_AT = f"{_REQUEST_LOGGER}:55"
_RECEIVED_AT = f"{_REQUEST_LOGGER}:65"
_ADDED_AT = "v1/engine/async_llm.py:578"
_ABORTED_AT = "v1/engine/async_llm.py:640"
_STATS_AT = "v1/metrics/loggers.py:335"
_MODEL_ERROR_AT = "entrypoints/.../chat_completion/serving.py:274"
_ERROR_RESPONSE_AT = "entrypoints/.../exception_handling/error_response.py:24"
_BANNER_AT = "entrypoints/openai/api_server.py:1874"


@dataclass(frozen=True, slots=True)
class SamplingParamsView:
    """The fields of vLLM's ``SamplingParams.__repr__`` (current order), for logging."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    max_tokens: int = 16
    min_tokens: int = 0
    logprobs: int | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __repr__(self) -> str:
        greedy = self.temperature < 1e-5  # vLLM normalises greedy requests' sampling knobs
        top_p, top_k, min_p = (1.0, 0, 0.0) if greedy else (self.top_p, self.top_k, 0.0)
        fields: list[tuple[str, Any]] = [
            ("n", 1), ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty), ("repetition_penalty", 1.0),
            ("temperature", self.temperature), ("watermarking", None), ("top_p", top_p),
            ("top_k", top_k),
            ("min_p", min_p), ("seed", self.seed), ("stop", list(self.stop)),
            ("stop_token_ids", []), ("bad_words", []), ("thinking_token_budget", None),
            ("include_stop_str_in_output", False), ("ignore_eos", self.ignore_eos),
            ("max_tokens", self.max_tokens), ("min_tokens", self.min_tokens),
            ("logprobs", self.logprobs), ("prompt_logprobs", None),
            ("skip_special_tokens", True), ("spaces_between_special_tokens", True),
            ("structured_outputs", None), ("extra_args", None),
        ]  # fmt: skip
        return "SamplingParams(" + ", ".join(f"{k}={v!r}" for k, v in fields) + ")"


def lora_request_repr(name: str, int_id: int, path: str) -> str:
    """vLLM's ``LoRARequest`` repr as printed in ``Received request`` lines."""
    return (
        f"LoRARequest(lora_name={name!r}, lora_int_id={int_id}, lora_path={path!r}, "
        "lora_local_path=None, long_lora_max_len=None, base_model_name=None, "
        "tensorizer_config_dict=None)"
    )


def _open_log(path: Path) -> IO[str]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("a", encoding="utf-8", buffering=1)
    except OSError as exc:
        raise BadInputError(f"cannot write the log file ({exc.strerror})", where=str(path)) from exc


class VllmLogWriter:
    """Writes vLLM-format lines to a file and/or a stream; safe to share between threads."""

    def __init__(
        self, path: Path | None = None, *, pid: int, stream: IO[str] | None = None
    ) -> None:
        self.pid = pid
        self._lock = threading.Lock()
        self._file = _open_log(path) if path else None
        self._stream = stream
        self.enabled = self._file is not None or stream is not None

    def _write(self, text: str, *, tagged: bool = True) -> None:
        line = f"(APIServer pid={self.pid}) {text}\n" if tagged else f"{text}\n"
        with self._lock:
            for sink in (self._file, self._stream):
                if sink is not None:
                    sink.write(line)
                    sink.flush()

    def log(self, level: str, where: str, message: str) -> None:
        """One vLLM logger line: level, UTC timestamp without year, ``[file:line]``, message."""
        if not self.enabled:
            return
        stamp = datetime.now(UTC).strftime("%m-%d %H:%M:%S")
        self._write(f"{level} {stamp} [{where}] {message}")

    def uvicorn(self, message: str, level: str = "INFO") -> None:
        """One uvicorn line (``INFO:     …``): no timestamp, level padded to 9 characters."""
        self._write(f"{(level + ':').ljust(9)} {message}", tagged=False)

    def banner(self, description: str) -> None:
        """The start-up lines: the simulator says what it is before anything else."""
        self.log("INFO", _BANNER_AT, f"prewarm engine SIMULATOR (not vLLM): {description}")
        self.uvicorn(f"Started server process [{self.pid}]")
        self.uvicorn("Waiting for application startup.")
        self.uvicorn("Application startup complete.")

    def request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: Sequence[int] | None,
        params: SamplingParamsView,
        lora_request: str | None,
    ) -> None:
        """The DEBUG details line and the INFO ``Received request`` line, in vLLM's order."""
        if not self.enabled:
            return
        ids = None if prompt_token_ids is None else list(prompt_token_ids)
        self.log(
            "DEBUG",
            _DETAILS_AT,
            f"Request {request_id} details: prompt: {prompt!r}, prompt_token_ids: {ids}, "
            "prompt_embeds shape: None.",
        )
        self.log(
            "INFO",
            _RECEIVED_AT,
            f"Received request {request_id}: params: {params!r}, lora_request: {lora_request}.",
        )

    def body(self, random_id: str, body: str) -> None:
        """vLLM 0.32's DEBUG ``Request <id> JSON body: …`` line (the id without its prefix)."""
        self.log("DEBUG", _BODY_AT, f"Request {random_id} JSON body: {body}")

    def model_error(self, message: str) -> None:
        """The ERROR line vLLM writes when a request names a model it does not serve."""
        self.log(
            "ERROR", _MODEL_ERROR_AT,
            f"Error with model error=ErrorInfo(message={message!r}, type='NotFoundError', "
            "param='model', code=404)",
        )  # fmt: skip

    def validation_error(self, message: str) -> None:
        """The DEBUG line of a request refused as invalid (e.g. too long for the context)."""
        self.log("DEBUG", _ERROR_RESPONSE_AT, f"create_error_response called with {message}")

    def added(self, engine_request_id: str) -> None:
        """``Added request <id>.`` with the engine-internal id (external id + 8 hex)."""
        self.log("INFO", _ADDED_AT, f"Added request {engine_request_id}.")

    def aborted(self, engine_request_id: str, request_id: str) -> None:
        """The pair vLLM prints when a client goes away mid-request."""
        self.log("INFO", _ABORTED_AT, f"Aborted request(s) {engine_request_id}.")
        self.log("INFO", "v1/engine/async_llm.py:400", f"Request {request_id} aborted.")

    def access(self, client: str, method: str, path: str, version: str, status: str) -> None:
        """uvicorn's access line, written when the response starts."""
        self.uvicorn(f'{client} - "{method} {path} HTTP/{version}" {status}')

    def stats(self, line: str, *, idle: bool) -> None:
        """The periodic ``Engine 000:`` stats line (vLLM logs idle intervals at DEBUG)."""
        self.log("DEBUG" if idle else "INFO", _STATS_AT, line)

    def close(self) -> None:
        """Close the log file (the stream belongs to the caller)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
