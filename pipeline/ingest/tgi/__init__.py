"""Hugging Face TGI router logs, v1 to v3, text and ``--json-output`` (FORMATS.md section 2).

Text events start with ``<RFC 3339 µs timestamp> <LEVEL> ``; any other line continues the
previous event's message (DEBUG ``Input:`` of a chat template spans lines). The line loop
(:mod:`.parser`) reads each line into an event (:mod:`.events`: spans, target, message), the
events become records (:mod:`.records`, their values read by :mod:`.values`), and a record's
time is its event's minus the request's total time (:mod:`.arrival`).
"""

from pipeline.ingest.tgi.arrival import arrival_ts
from pipeline.ingest.tgi.events import (
    ENDPOINTS,
    EVENT_START,
    parse_spans,
    printed_parameters,
    span_fields,
)
from pipeline.ingest.tgi.parser import TgiChunkParser

__all__ = [
    "ENDPOINTS",
    "EVENT_START",
    "TgiChunkParser",
    "arrival_ts",
    "parse_spans",
    "printed_parameters",
    "span_fields",
]
