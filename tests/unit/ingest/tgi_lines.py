"""TGI router log lines as the router prints them (FORMATS.md section 2), text and
``--json-output``, v1.0 (the HTTP request span, raw ``max_new_tokens``) and v3.x: one request's
events in TGI's order (``router/src/server.rs``: ``Input:`` when its clock starts; ``Token:``
lines of a stream; ``Output:`` and ``Success`` once its timings are recorded, or an error of
the request), for tests that interleave concurrent requests."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

SERVER = ("text_generation_router::server", "router/src/server.rs")
INFER = ("text_generation_router::infer", "router/src/infer/mod.rs")
BACKEND = ("text_generation_router_v3::backend", "backends/v3/src/backend.rs")
#: an error's message and where TGI logs it: (target, file), line, child spans (non-streaming)
ERRORS = {
    "overloaded": (INFER, 118, ["generate", "generate_stream"], "no permits available"),
    "rejected": (INFER, 126, ["generate", "generate_stream"],
                 "`inputs` tokens + `max_new_tokens` must be <= 8192. Given: 8150 `inputs` "
                 "tokens and {max_new_tokens} `max_new_tokens`"),
    "failed": (BACKEND, 546, ["generate", "generate_stream", "schedule", "infer", "send_error"],
               "Request failed during generation: Server error: CUDA out of memory."),
    # ``generate_stream_internal``: polled with the response body, outside any span
    "best_of": (SERVER, 547, [],
                "Input validation error: `best_of` != 1 is not supported when streaming tokens"),
    "prefill_details": (SERVER, 552, [], "Input validation error: `decoder_input_details` == "
                        "true is not supported when streaming tokens"),
}  # fmt: skip
#: the stream-only validation errors, printed without a span
STREAM_ERRORS = ("best_of", "prefill_details")
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"

#: the first request's clock, and each TGI handler's route
START_US = 1_748_943_720_000_000
ENDPOINT = {
    "generate": "/generate",
    "generate_stream": "/generate_stream",
    "chat_completions": "/v1/chat/completions",
    "completions": "/v1/completions",
}


@dataclass
class Request:
    """One request to the router and what it printed about it."""

    handler: str  # generate, generate_stream, chat_completions, completions
    prompt: str
    start_us: int  # when its clock started (Unix µs)
    #: a streaming ``/v1/completions`` request (its ``Input:`` printed without a span)
    stream: bool = False
    best_of: int | None = None
    decoder_input_details: bool = False
    temperature: float | None = None
    max_new_tokens: int | None = 20
    client_seed: int | None = None
    drawn_seed: int | None = None  # the server's, for a sampling request without one
    #: ok | overloaded | rejected | failed | best_of | prefill_details (span-less rejections)
    outcome: str = "ok"
    total_ns: int = 1_000_000
    tokens: int = 4
    version: int = 3  # 1: v1.0 (HTTP span, bare max_new_tokens), 3: v3.3
    trace_id: str = TRACE_ID
    #: µs after the clock starts: the Input's stamp, the Output's after total_time, the Success's
    #: after the Output (its line's write), an error's after the Input (printed by the same task)
    input_lag_us: int = 0
    output_lag_us: int = 0
    success_lag_us: int = 0
    error_lag_us: int = 5
    lines: dict[str, int] = field(default_factory=dict)

    @property
    def sampling(self) -> bool:
        return self.temperature is not None

    @property
    def seed_used(self) -> int | None:
        if not self.sampling:
            return None
        return self.client_seed if self.client_seed is not None else self.drawn_seed

    @property
    def streamed(self) -> bool:
        return self.handler == "generate_stream" or (self.handler == "completions" and self.stream)

    def parameters(self) -> str:
        temperature = "None" if self.temperature is None else f"Some({self.temperature})"
        seed = "None" if self.client_seed is None else f"Some({self.client_seed})"
        best_of = "None" if self.best_of is None else f"Some({self.best_of})"
        prefill = str(self.decoder_input_details).lower()
        if self.version == 1:
            return (
                f"GenerateParameters {{ best_of: {best_of}, temperature: {temperature}, "
                "repetition_penalty: None, top_k: None, top_p: None, typical_p: None, "
                f"do_sample: {str(self.sampling).lower()}, max_new_tokens: {self.max_new_tokens}, "
                "return_full_text: None, stop: [], truncate: None, watermark: false, "
                f"details: false, decoder_input_details: false, seed: {seed}, "
                "top_n_tokens: None }"
            )
        max_new = "None" if self.max_new_tokens is None else f"Some({self.max_new_tokens})"
        return (
            f"GenerateParameters {{ best_of: {best_of}, temperature: {temperature}, "
            "repetition_penalty: None, frequency_penalty: None, top_k: None, top_p: None, "
            f"typical_p: None, do_sample: {str(self.sampling).lower()}, max_new_tokens: "
            f'{max_new}, return_full_text: None, stop: ["</s>"], truncate: None, '
            f"watermark: false, details: true, decoder_input_details: {prefill}, "
            f"seed: {seed}, top_n_tokens: None, grammar: None, adapter_id: None }}"
        )

    def timings(self) -> dict[str, str]:
        """The fields recorded when the request is done (Rust ``Duration`` Debug texts)."""
        inference = self.total_ns - 300_000
        seed = "None" if self.seed_used is None else f"Some({self.seed_used})"
        return {
            "total_time": rust_duration(self.total_ns), "validation_time": "200µs",
            "queue_time": "100µs", "inference_time": rust_duration(inference),
            "time_per_token": rust_duration(inference // self.tokens), "seed": seed,
        }  # fmt: skip

    def handler_fields(self, done: bool) -> dict[str, str]:
        """The handler span's fields printed at an event: parameters (not by ``completions``),
        and the timings once recorded."""
        fields = {} if self.handler == "completions" else {"parameters": self.parameters()}
        return {**fields, **self.timings()} if done else fields

    def events(self) -> list[Event]:
        """The request's events in the order TGI prints them."""
        start = self.start_us
        input_line = 520 if self.streamed else 299
        events = [self._event("input", start + self.input_lag_us, "DEBUG", SERVER, input_line,
                              f"Input: {self.prompt}", done=False)]  # fmt: skip
        if self.outcome != "ok":
            (target, line, children, message) = ERRORS[self.outcome]
            if self.streamed and children:
                children = ["async_stream", *children[1:]]
            at = start + self.input_lag_us + self.error_lag_us
            message = message.format(max_new_tokens=self.max_new_tokens)
            events.append(self._event("error", at, "ERROR", target, line, message, False, children))
            return events
        done_at = start + self.total_ns // 1000 + self.output_lag_us
        if self.streamed:
            for k in range(2):
                token = f'Token: Token {{ id: {k}, text: "t{k}", logprob: -0.5, special: false }}'
                events.append(self._event("token", start + 50 + k, "DEBUG", SERVER, 573, token))
        out_line, success_line = (636, 637) if self.streamed else (431, 432)
        events.append(self._event("output", done_at, "DEBUG", SERVER, out_line, "Output: fine"))
        success_at = done_at + self.success_lag_us
        events.append(self._event("success", success_at, "INFO", SERVER, success_line, "Success"))
        return events

    def _event(
        self, kind: str, at_us: int, level: str, where: tuple[str, str], line: int,
        message: str, done: bool = True, children: list[str] | None = None,
    ) -> Event:  # fmt: skip
        return Event(self, kind, at_us, level, where, line, message, done, children or [])


@dataclass
class Event:
    """One event of a request, printable as text or JSON."""

    request: Request
    kind: str
    at_us: int
    level: str
    where: tuple[str, str]
    line: int
    message: str
    done: bool
    children: list[str]

    @property
    def spanless(self) -> bool:
        """Printed outside any span: a streaming ``/v1/completions`` request's ``Input:``
        (``generate_stream_internal`` in a spawned task), a stream-only validation error."""
        request = self.request
        stream_input = self.kind == "input" and request.handler == "completions" and request.stream
        return stream_input or (self.kind == "error" and request.outcome in STREAM_ERRORS)

    def text(self) -> list[str]:
        """The event as text lines (a prompt with newlines goes on over lines)."""
        request = self.request
        fields = request.handler_fields(self.done)
        spans = [_text_span(request.handler, fields, quoted=request.handler == "chat_completions")]
        if request.version == 1:
            spans.insert(
                0, f"HTTP request{{http.route=/{request.handler} trace_id={request.trace_id}}}"
            )
        spans.extend(self.children)
        scope = "" if self.spanless else f"{':'.join(spans)}: "
        head = f"{timestamp(self.at_us)} {self.level:>5} {scope}"
        return f"{head}{self.where[0]}: {self.where[1]}:{self.line}: {self.message}".split("\n")

    def json(self) -> str:
        """The event as one ``--json-output`` line (streaming events after the ``Input:`` have
        an explicit parent: ``"spans": []``)."""
        request = self.request
        handler = {**request.handler_fields(self.done), "name": request.handler}
        handler = {key: handler[key] for key in sorted(handler) if key != "name"} | {
            "name": request.handler
        }
        scope = [handler, *({"name": child} for child in self.children)]
        if request.version == 1:
            scope.insert(0, {"http.route": f"/{request.handler}", "name": "HTTP request",
                             "trace_id": request.trace_id})  # fmt: skip
        detached = request.streamed and self.kind in ("token", "output", "success")
        obj = {
            "timestamp": timestamp(self.at_us), "level": self.level, "message": self.message,
            "target": self.where[0], "filename": self.where[1], "line_number": self.line,
            "span": handler if detached else scope[-1], "spans": [] if detached else scope,
        }  # fmt: skip
        if self.spanless:
            del obj["span"], obj["spans"]
        return json.dumps(obj, ensure_ascii=False)


def _text_span(name: str, fields: dict[str, str], quoted: bool) -> str:
    """``name{k=v ...}`` (``name`` alone without fields): timings are recorded as strings
    (quoted); parameters raw Debug, or a string from v3.2 in ``chat_completions``."""
    if not fields:
        return name
    parts = [
        f"{key}={rust_debug_str(value) if key != 'parameters' or quoted else value}"
        for key, value in fields.items()
    ]
    return f"{name}{{{' '.join(parts)}}}"


def timestamp(at_us: int) -> str:
    """An event time as the router prints it: UTC, microseconds."""
    instant = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=at_us)
    return instant.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rust_duration(ns: int) -> str:
    """A Rust ``Duration``'s Debug text (trailing zeros trimmed)."""
    for unit, size in (("s", 10**9), ("ms", 10**6), ("µs", 10**3)):
        if ns >= size:
            whole, frac = divmod(ns, size)
            digits = f"{frac:0{len(str(size)) - 1}d}".rstrip("0")
            return f"{whole}.{digits}{unit}" if digits else f"{whole}{unit}"
    return f"{ns}ns"


def rust_debug_str(text: str) -> str:
    """A string as Rust's ``Debug`` prints it: quoted, with ``\\``, ``\"`` and control
    characters escaped."""
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return '"' + "".join(escapes.get(c, c) for c in text) + '"'
