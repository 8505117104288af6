"""vLLM logs, v0.4 to current (see ``data/logs/FORMATS.md`` section 1).

One pass over the lines of a chunk (:mod:`.parser`): strip ANSI codes, a trailing ``\\r`` and
the ``(APIServer pid=N)`` tag; read the envelope (``LEVEL MM-DD HH:MM:SS [file:line] message``,
the ``[`` optional, any ``VLLM_LOGGING_PREFIX`` before the level: :mod:`.envelope`); dispatch on
the start of the message (:mod:`.messages`). Request lines (their values read by
:mod:`.request_lines` and :mod:`.fields`) are joined by request id (:mod:`.requests`; an
engine's ``-xxxxxxxx`` suffix is stripped); stats lines become engine-metrics rows; uvicorn
access lines with a 4xx/5xx status on a route that runs a request become failed records (they
are the only trace of requests rejected before the engine); every other line of the envelope
is counted as ignored, by kind.
"""

from pipeline.ingest.lines import ANSI
from pipeline.ingest.vllm.envelope import BLANK, NOT_A_REQUEST_LINE
from pipeline.ingest.vllm.parser import VllmChunkParser
from pipeline.ingest.vllm.request_lines import cut_looking, whole_value, without_token_ids
from pipeline.ingest.vllm.requests import ENGINE_SUFFIX

__all__ = [
    "ANSI",
    "BLANK",
    "ENGINE_SUFFIX",
    "NOT_A_REQUEST_LINE",
    "VllmChunkParser",
    "cut_looking",
    "whole_value",
    "without_token_ids",
]
