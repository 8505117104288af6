"""What parsing one byte range of one log file yields, before the file is assembled.

Log lines of one request are joined by request id. A chunk cannot see the other chunks, so
it hands out:

* ``heads`` — one row per request whose defining line (vLLM ``Received request``, a TGI
  ``Success`` or error event) lies in this chunk, as column lists;
* ``tails`` — what later lines said about requests whose defining line is not in this chunk
  (an ``Aborted`` in the next chunk, a ``Generated response`` ...), keyed by request id, to be
  applied to the head when the file is assembled;
* ``metrics`` — engine-metrics rows from stats lines, as column lists.

Timestamps without a year (vLLM) travel as text (``MM-DD HH:MM:SS``) and are resolved for the
whole file at assembly; timestamps with a zone travel as ISO text too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline.ingest.summary import Rejects

#: columns of a head row as a chunk hands it out (canonical names, plus helpers prefixed ``_``)
HEAD_FIELDS = (
    "ts",
    "request_id",
    "model",
    "adapter",
    "tenant",
    "endpoint",
    "prompt",
    "prompt_truncated",
    "prompt_tokens",
    "output_tokens",
    "prefix_hashes",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "seed",
    "seed_used",
    "params_hash",
    "ttft_s",
    "e2e_s",
    "queue_s",
    "status",
    "request_body",
    "cache_hit",
    "deployment",
    "_line",
    "_ids_len",
)

METRIC_FIELDS = (
    "ts",
    "source",
    "instance",
    "prompt_throughput",
    "throughput",
    "running",
    "waiting",
    "swapped",
    "deferred",
    "preemptions",
    "kv_usage",
    "cpu_kv_usage",
    "prefix_cache_hit_rate",
    "cpu_prefix_cache_hit_rate",
    "external_prefix_cache_hit_rate",
    "mm_cache_hit_rate",
)


@dataclass
class ChunkResult:
    """Everything one chunk of one file produced (plain data: picklable and JSON-able)."""

    path: str
    format: str
    start: int = 0
    end: int = 0
    heads: list[dict[str, Any]] = field(default_factory=list)
    #: heads read column-wise (:mod:`pipeline.ingest.columnar`): frames of head columns
    head_frames: list[Any] = field(default_factory=list)
    tails: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    rejects: Rejects = field(default_factory=Rejects)
    ignored: Counter[str] = field(default_factory=Counter)
    lines: int = 0
    bytes_read: int = 0
    repaired: int = 0
    #: the byte offset just past the last line consumed (for incremental ingestion)
    offset: int = 0
    #: prompt lengths equal to their token-id list lengths where the text is too short to
    #: hold that many tokens: evidence of ``--max-log-len`` (see ``assemble.detect_cap``)
    cap_evidence: Counter[int] = field(default_factory=Counter)
    #: the longest prompt (characters) and token-id list (prompt or output) seen: a cap below
    #: either is refuted
    longest_prompt: int = 0
    longest_ids: int = 0
    notes: list[str] = field(default_factory=list)
    #: line numbers where a year-less timestamp's month fell back (December -> January)
    rollovers: list[int] = field(default_factory=list)
    first_ts: str | None = None
    last_ts: str | None = None
    #: ServeGen series are aggregates, not requests: counts-shape rows
    counts: list[dict[str, Any]] = field(default_factory=list)
    #: request ids of the heads (tails of later pieces join the latest head with their id)
    head_ids: list[str] = field(default_factory=list)
    #: where this piece's heads and metrics parts were written (``<part>.heads.arrow`` ...)
    part: str = ""
    #: records of a piece finished where it was parsed (``<part>.records.arrow`` and
    #: ``<part>.counts.arrow`` instead of heads); ``None``: finished with its file
    finished_rows: int | None = None
    #: the latest request ids of a piece finished where it was parsed
    recent_ids: list[str] = field(default_factory=list)


def chunk_meta(result: ChunkResult) -> dict[str, Any]:
    """A chunk's light remainder (no heads, no metrics) as JSON-ready data."""
    data = asdict(result)
    data.pop("heads")
    data.pop("head_frames")
    data.pop("metrics")
    data["rejects"] = result.rejects.to_dict()
    data["ignored"] = dict(result.ignored)  # asdict() mangles a Counter's items
    data["cap_evidence"] = {str(k): v for k, v in result.cap_evidence.items()}
    return data


def chunk_from_meta(data: dict[str, Any]) -> ChunkResult:
    """Inverse of :func:`chunk_meta`."""
    data = dict(data)
    rejects = Rejects.from_dict(data["path"], data.pop("rejects"))
    ignored = Counter(data.pop("ignored"))
    cap = Counter({int(k): v for k, v in data.pop("cap_evidence").items()})
    return ChunkResult(**data, rejects=rejects, ignored=ignored, cap_evidence=cap)
