"""How to read the inputs: the assumptions a log cannot tell by itself."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import BadInputError
from pipeline.ingest.lines import DEFAULT_MAX_LINE_BYTES
from pipeline.prefix_blocks import DEFAULT_BLOCK_SIZE

#: byte size of one chunk of a large file; 32 MiB keeps a worker well under 300 MB
DEFAULT_CHUNK_BYTES = 32 << 20


@dataclass(frozen=True)
class IngestOptions:
    """Options of an ingest run.

    vLLM timestamps carry neither year nor zone (``MM-DD HH:MM:SS``, local time of the
    container). ``tz`` names that zone (default ``UTC``, what containers usually run).
    ``year`` is the year of a file's *first* entry; by default the year is chosen so that the
    file's *last* entry falls on or before the file's modification time (at most one day
    later, for clock skew): the year of the modification time, or the year before. Inside a
    file, a month that falls back by more than six months starts the next year.

    ``block_size``: tokens per prefix block (pseudo-tokens for text, real ids for token-id
    prompts). ``format`` overrides detection for every path; ``source`` keeps detection to
    the formats whose records carry that source (``"vllm"``: vLLM's text and OTel JSON forms),
    the first of them when none matches. ``max_log_len``: the vLLM
    ``--max-log-len`` the server ran with, when known (else detected from prompts whose
    length equals their token-id list's). ``model`` / ``tenant`` fill those fields for log
    records, which do not carry them. ``workers``: processes for chunks of large files (1 =
    in this process). ``trace_epoch``: start time of relative-time traces (Mooncake,
    ServeGen), ISO text; default :data:`pipeline.ingest.traces.TRACE_EPOCH`.
    ``min_item_requests``: items with fewer requests in all get no dense feature rows (their
    count rows are kept): an item seen once would cost ``max(lags)`` zero rows, and a 1 GB log
    holds millions of such prompt-tail blocks.
    """

    year: int | None = None
    tz: str = "UTC"
    block_size: int = DEFAULT_BLOCK_SIZE
    format: str | None = None
    source: str | None = None
    max_log_len: int | None = None
    model: str | None = None
    tenant: str | None = None
    window: str = "10min"
    workers: int = 1
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    trace_epoch: str | None = None
    min_item_requests: int = 2

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise BadInputError("must be at least 1", where="block_size")
        if self.year is not None and not 1970 <= self.year <= 9999:
            raise BadInputError(f"{self.year} is not a plausible year", where="year")
        if self.chunk_bytes < 1 << 16 or self.max_line_bytes < 1 << 10:
            raise BadInputError("chunk at least 64 KiB, line cap at least 1 KiB", where="options")
