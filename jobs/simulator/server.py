"""The simulator's HTTP surface: vLLM's OpenAI-compatible routes on Starlette.

Every response carries ``server: prewarm-simulator``; models are ``owned_by`` the simulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jobs.simulator import protocol as proto
from jobs.simulator import render, responses
from jobs.simulator.chat import render_chat
from jobs.simulator.engine import (
    Generation,
    GenerationRequest,
    ModelNotFoundError,
    PromptTooLongError,
    SimulatedEngine,
)
from jobs.simulator.outputs import SimulatedToken, embed_text
from jobs.simulator.vllm_log import VllmLogWriter
from pipeline.errors import BadInputError
from pipeline.prefix_blocks import count_tokens

SERVER_HEADER = (b"server", b"prewarm-simulator")


class SimulatedFailure(RuntimeError):
    """An injected engine failure (answered with HTTP 500)."""


class AccessLogMiddleware:
    """Writes uvicorn's access line into the vLLM log when a response starts."""

    def __init__(self, app: ASGIApp, log: VllmLogWriter) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_logged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), SERVER_HEADER]
                self._access(scope, message["status"])
            await send(message)

        await self.app(scope, receive, send_logged)

    def _access(self, scope: Scope, status: int) -> None:
        host, port = scope.get("client") or ("-", 0)
        path = scope["path"] + (
            f"?{scope['query_string'].decode()}" if scope["query_string"] else ""
        )
        phrase = HTTPStatus(status).phrase
        self.log.access(
            f"{host}:{port}", scope["method"], path, scope["http_version"], f"{status} {phrase}"
        )


def _error(message: str, err_type: str, status: int) -> JSONResponse:
    return JSONResponse(proto.error_body(message, err_type, status), status_code=status)


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise proto.ProtocolError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise proto.ProtocolError("request body must be a JSON object")
    return body


class SimulatorRoutes:
    """Route handlers bound to one engine."""

    def __init__(self, engine: SimulatedEngine) -> None:
        self.engine = engine

    async def _admit(self) -> None:
        faults = self.engine.config.faults
        if faults.delay_s > 0:
            await asyncio.sleep(faults.delay_s)
        if faults.should_fail():
            raise SimulatedFailure("simulated engine failure (prewarm simulator fault injection)")

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": "prewarm-simulator"})

    async def metrics(self, request: Request) -> Response:
        self.engine.metrics.kv_usage.set(self.engine.cache.usage)
        return Response(self.engine.metrics.render(), media_type="text/plain; version=0.0.4")

    async def models(self, request: Request) -> Response:
        config, created = self.engine.config, int(time.time())

        def card(name: str, root: str, parent: str | None) -> dict[str, Any]:
            return {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "prewarm-simulator",
                "root": root,
                "parent": parent,
                "max_model_len": config.max_model_len,
                "permission": [],
            }

        cards = [card(config.model, config.model, None)]
        cards += [card(a.name, a.path, config.model) for a in self.engine.adapters.values()]
        return JSONResponse({"object": "list", "data": cards})

    async def reset_prefix_cache(self, request: Request) -> Response:
        self.engine.reset_prefix_cache()
        return Response(status_code=200)

    async def _accept(self, request: Request, kind: str) -> tuple[dict[str, Any], str]:
        """Parse and log the body (as vLLM 0.32 does at DEBUG), then apply injected faults."""
        body = await _json_body(request)
        rid, random_part = proto.request_id(kind, request.headers.get("x-request-id"))
        compact = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
        self.engine.log.body(random_part, compact)
        await self._admit()
        return body, rid

    async def completions(self, request: Request) -> Response:
        body, rid = await self._accept(request, "cmpl")
        adapter = self.engine.resolve_model(body.get("model"))
        params = proto.sampling_params(body, default_max_tokens=16, chat=False)
        prompts = proto.completion_prompts(body)
        salt = _salt(body)
        generations = [
            self.engine.prepare(
                _completion_request(f"{rid}-{i}", self.engine, prompt, params, adapter, salt)
            )
            for i, prompt in enumerate(prompts)
        ]
        model = body.get("model") or self.engine.config.model
        if body.get("stream"):
            if len(generations) > 1:
                raise proto.ProtocolError("the simulator streams one prompt per request")
            return self._stream(generations[0], rid, model, body, chat=False)
        outputs = await asyncio.gather(*(_run(g) for g in generations))
        return JSONResponse(
            responses.completion_body(rid, model, generations, outputs, params.logprobs)
        )

    async def chat(self, request: Request) -> Response:
        body, rid = await self._accept(request, "chatcmpl")
        adapter = self.engine.resolve_model(body.get("model"))
        prompt = render_chat(
            body.get("messages"), add_generation_prompt=body.get("add_generation_prompt", True)
        )
        limit = max(1, self.engine.config.max_model_len - count_tokens(prompt))
        params = proto.sampling_params(body, default_max_tokens=limit, chat=True)
        generation = self.engine.prepare(
            GenerationRequest(
                rid,
                self.engine.config.model,
                prompt,
                params,
                adapter=adapter,
                cache_salt=_salt(body),
            )
        )
        model = body.get("model") or self.engine.config.model
        if body.get("stream"):
            return self._stream(generation, rid, model, body, chat=True)
        tokens = await _run(generation)
        return JSONResponse(responses.chat_body(rid, model, generation, tokens, params.logprobs))

    def _stream(
        self, generation: Generation, rid: str, model: str, body: dict[str, Any], *, chat: bool
    ) -> Response:
        options = body.get("stream_options") or {}
        chunks = responses.chat_chunks if chat else responses.completion_chunks
        stream = chunks(generation, rid, model, bool(options.get("include_usage")))
        return StreamingResponse(_guarded(generation, stream), media_type="text/event-stream")

    async def embeddings(self, request: Request) -> Response:
        """vLLM's ``/v1/embeddings`` shape, with the simulator's hashed bag-of-words vectors."""
        body = await _json_body(request)
        await self._admit()
        self.engine.resolve_model(body.get("model"))
        inputs = body.get("input")
        texts = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise proto.ProtocolError("'input' must be a string or a list of strings")
        data = [
            {"index": i, "object": "embedding", "embedding": embed_text(t)}
            for i, t in enumerate(texts)
        ]
        tokens = sum(count_tokens(t) for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
        model = body.get("model") or self.engine.config.model
        return JSONResponse(
            {"id": proto.request_id("embd", None)[0], "object": "list", "created": int(time.time()),
             "model": model, "data": data, "usage": usage}
        )  # fmt: skip

    async def tokenize(self, request: Request) -> Response:
        """vLLM's ``/tokenize`` shape, counting the simulator's pseudo-tokens."""
        body = await _json_body(request)
        self.engine.resolve_model(body.get("model"))
        if "messages" in body:
            generation_prompt = body.get("add_generation_prompt", True)
            text = render_chat(body["messages"], add_generation_prompt=generation_prompt)
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise proto.ProtocolError("'prompt' (a string) or 'messages' is required")
        ids = render.prompt_ids(text)
        return JSONResponse(
            {"count": len(ids), "max_model_len": self.engine.config.max_model_len,
             "tokens": ids, "token_strs": None}
        )  # fmt: skip

    async def completion_render(self, request: Request) -> Response:
        """vLLM's ``/v1/completions/render``: the token-in requests, nothing run or logged."""
        body = await _json_body(request)
        self.engine.resolve_model(body.get("model"))
        return JSONResponse(render.completion_render(body, self.engine.config.model))

    async def chat_render(self, request: Request) -> Response:
        """vLLM's ``/v1/chat/completions/render``: the chat's token-in request."""
        body = await _json_body(request)
        self.engine.resolve_model(body.get("model"))
        return JSONResponse(render.chat_render(body, self.engine.config.model))

    async def load_lora(self, request: Request) -> Response:
        body = await _json_body(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return _error(
                "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput", 400
            )
        if name in self.engine.adapters:
            return _error(
                f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput", 400
            )
        if str(path).startswith("/") and not Path(path).exists():
            return _error(
                f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError", 404
            )
        await asyncio.sleep(self.engine.config.adapter_load_ms / 1000.0)
        self.engine.add_adapter(str(name), str(path))
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(self, request: Request) -> Response:
        body = await _json_body(request)
        name = body.get("lora_name")
        if not name and not body.get("lora_int_id"):
            return _error(
                "either 'lora_name' and 'lora_int_id' needs to be provided.",
                "InvalidUserInput",
                400,
            )
        if name not in self.engine.adapters:
            return _error(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404)
        del self.engine.adapters[name]
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def _completion_request(
    rid: str, engine: SimulatedEngine, prompt: str | list[int], params: Any, adapter: Any,
    salt: str | None,
) -> GenerationRequest:  # fmt: skip
    text = prompt if isinstance(prompt, str) else None
    ids = None if isinstance(prompt, str) else prompt
    return GenerationRequest(rid, engine.config.model, text, params, ids, adapter, cache_salt=salt)


def _salt(body: dict[str, Any]) -> str | None:
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise proto.ProtocolError("'cache_salt' must be a non-empty string")
    return salt


async def _run(generation: Generation) -> list[SimulatedToken]:
    completed = False
    try:
        await generation.prefill()
        tokens = [token async for token in generation.stream()]
        completed = True
        return tokens
    finally:
        generation.finish(aborted=not completed)


async def _guarded(generation: Generation, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Stream ``chunks``; a client that goes away mid-stream is logged as an abort."""
    completed = False
    try:
        async for chunk in chunks:
            yield chunk
        completed = True
    finally:
        if not completed:
            generation.engine.log.aborted(
                generation.engine_request_id, generation.request.request_id
            )
        generation.finish(aborted=not completed)


def _handlers(engine: SimulatedEngine) -> dict[Any, Callable[..., Any]]:
    def not_found(request: Request, exc: Exception) -> Response:
        engine.log.model_error(str(exc))
        return JSONResponse(proto.error_body(str(exc), "NotFoundError", 404, "model"), 404)

    def bad_request(request: Request, exc: Exception) -> Response:
        return _error(str(exc), "BadRequestError", 400)

    def too_long(request: Request, exc: Exception) -> Response:
        engine.log.validation_error(f"VLLMValidationError: {exc}")
        return _error(str(exc), "BadRequestError", 400)

    def failure(request: Request, exc: Exception) -> Response:
        return _error(str(exc), "InternalServerError", 500)

    return {
        ModelNotFoundError: not_found,
        proto.ProtocolError: bad_request,
        PromptTooLongError: too_long,
        BadInputError: bad_request,
        SimulatedFailure: failure,
    }


def build_app(engine: SimulatedEngine) -> Starlette:
    """The simulator's ASGI app for ``engine``; logs stats every ``stats_interval_s``."""
    routes = SimulatorRoutes(engine)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(_stats_loop(engine))
        try:
            yield
        finally:
            task.cancel()

    app = Starlette(
        routes=[
            Route("/health", routes.health, methods=["GET"]),
            Route("/version", routes.version, methods=["GET"]),
            Route("/metrics", routes.metrics, methods=["GET"]),
            Route("/v1/models", routes.models, methods=["GET"]),
            Route("/v1/completions", routes.completions, methods=["POST"]),
            Route("/v1/chat/completions", routes.chat, methods=["POST"]),
            Route("/v1/completions/render", routes.completion_render, methods=["POST"]),
            Route("/v1/chat/completions/render", routes.chat_render, methods=["POST"]),
            Route("/v1/embeddings", routes.embeddings, methods=["POST"]),
            Route("/tokenize", routes.tokenize, methods=["POST"]),
            Route("/v1/load_lora_adapter", routes.load_lora, methods=["POST"]),
            Route("/v1/unload_lora_adapter", routes.unload_lora, methods=["POST"]),
            Route("/reset_prefix_cache", routes.reset_prefix_cache, methods=["POST"]),
        ],
        exception_handlers=_handlers(engine),
        lifespan=lifespan,
    )
    app.add_middleware(AccessLogMiddleware, log=engine.log)
    return app


async def _stats_loop(engine: SimulatedEngine) -> None:
    while True:
        await asyncio.sleep(engine.config.stats_interval_s)
        engine.log_stats()
