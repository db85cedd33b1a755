"""The OpenAI-compatible HTTP server: ``python -m mini_vllm serve``.

Mirrors ``vllm/entrypoints/openai/api_server.py`` (``build_app``, ``run_server``, the lifespan
that starts the engine) with FastAPI and uvicorn, as upstream uses them. Status codes are part of
the contract: a bad request is a 400 in OpenAI's error shape, a dead engine core a 503, never a
hang, and a 500 a bug in the server. The routes and the status rules: docs/upstream-fidelity.md
(module notes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

import mini_vllm
from mini_vllm.engine.async_llm import AsyncLLM
from mini_vllm.engine.core_client import EngineDeadError
from mini_vllm.entrypoints.chat_utils import load_chat_template
from mini_vllm.entrypoints.openai.cli_args import DEFAULT_SERVED_MODEL_NAME, engine_args_from_cli
from mini_vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from mini_vllm.entrypoints.openai.serving import BadRequestError, OpenAIServing, error_response
from mini_vllm.metrics.loggers import PrometheusStatLogger

logger = logging.getLogger("mini_vllm.serve")


def _validation_message(exc: RequestValidationError) -> str:
    """One line per problem, e.g. ``body.messages: Field required``."""
    lines = []
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            ctx = error.get("ctx") or {}
            return f"the request body is not valid JSON: {ctx.get('error', error.get('msg'))}"
        location = ".".join(str(part) for part in error.get("loc", ()))
        lines.append(f"{location}: {error.get('msg')}")
    return "; ".join(lines) or "invalid request"


class AuthenticationMiddleware:
    """``--api-key``: the OpenAI routes (``/v1/...``) answer 401 without ``Authorization:
    Bearer KEY``, as upstream's middleware; ``/health``, ``/metrics``, ``/version``,
    ``/tokenize`` and ``/detokenize`` (not under ``/v1``) stay open, so that probes and
    scrapers need no key. Keys are compared as SHA-256 digests with
    ``secrets.compare_digest`` against every key, so the time taken tells nothing about a key.
    """

    def __init__(self, app: ASGIApp, tokens: Sequence[str]) -> None:
        self.app = app
        self.token_digests = [hashlib.sha256(token.encode()).digest() for token in tokens]

    def _authorized(self, headers: Headers) -> bool:
        scheme, _, key = headers.get("authorization", "").partition(" ")
        digest = hashlib.sha256(key.encode()).digest()
        matches = [secrets.compare_digest(digest, known) for known in self.token_digests]
        return scheme.lower() == "bearer" and any(matches)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guarded = scope["type"] == "http" and scope["method"] != "OPTIONS"
        if (
            guarded
            and scope["path"].startswith("/v1")
            and not self._authorized(Headers(scope=scope))
        ):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def build_app(args: argparse.Namespace) -> FastAPI:
    """The FastAPI app; its lifespan starts the engine core and stops it on shutdown."""
    engine_args = engine_args_from_cli(args)
    chat_template = load_chat_template(args.chat_template)  # a bad path fails before the engine
    served_model_name = args.served_model_name or (
        engine_args.model if engine_args.model else DEFAULT_SERVED_MODEL_NAME
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stat_logger: PrometheusStatLogger | None = None

        class _LateLogger:  # the logger needs max_model_len, known after the handshake
            def record(self, *a: Any) -> None:
                if stat_logger is not None:
                    stat_logger.record(*a)

        engine = await AsyncLLM.create(engine_args, stat_loggers=[_LateLogger()])
        stat_logger = PrometheusStatLogger(served_model_name, engine.max_model_len)
        app.state.engine = engine
        app.state.stat_logger = stat_logger
        app.state.serving = OpenAIServing(
            engine,
            served_model_name,
            args.enable_prompt_tokens_details,
            chat_template=chat_template,
            default_chat_template_kwargs=args.default_chat_template_kwargs,
            trust_request_chat_template=args.trust_request_chat_template,
        )
        app.state.served_model_name = served_model_name
        logger.info(
            "serving %s (max_model_len=%d, %d KV blocks) on http://%s:%d",
            served_model_name,
            engine.max_model_len,
            engine.config["num_gpu_blocks"],
            args.host,
            args.port,
        )
        try:
            yield
        finally:
            engine.shutdown()

    app = FastAPI(title="mini-vLLM", lifespan=lifespan)
    # --api-key wins over VLLM_API_KEY, as upstream's.
    if api_keys := [key for key in (args.api_key or [os.environ.get("VLLM_API_KEY")]) if key]:
        app.add_middleware(AuthenticationMiddleware, tokens=api_keys)

    @app.exception_handler(RequestValidationError)
    async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(
            error_response(_validation_message(exc), "BadRequestError", 400), status_code=400
        )

    @app.exception_handler(BadRequestError)
    async def _on_bad_request(request: Request, exc: BadRequestError) -> JSONResponse:
        return JSONResponse(
            error_response(exc.message, "BadRequestError", 400, exc.param), status_code=400
        )

    @app.exception_handler(ValueError)
    async def _on_value_error(request: Request, exc: ValueError) -> JSONResponse:
        # The engine core refused a request the server's checks let through (upstream answers
        # a ValueError from the engine with a 400 too).
        return JSONResponse(error_response(str(exc), "BadRequestError", 400), status_code=400)

    @app.exception_handler(EngineDeadError)
    async def _on_engine_dead(request: Request, exc: EngineDeadError) -> JSONResponse:
        return JSONResponse(
            error_response(str(exc), "ServiceUnavailableError", 503), status_code=503
        )

    def _serving(request: Request) -> OpenAIServing:
        engine: AsyncLLM = request.app.state.engine
        if engine.errored:
            raise engine.dead_error
        return request.app.state.serving

    @app.get("/health")
    async def health(request: Request) -> Response:
        engine: AsyncLLM = request.app.state.engine
        if engine.errored or not engine.engine_core.proc.is_alive():
            return Response(status_code=503)
        return Response(status_code=200)

    @app.get("/version")
    async def show_version() -> JSONResponse:
        # Upstream's route, which tools probe to tell a vLLM server is there; the version is ours.
        return JSONResponse({"version": mini_vllm.__version__})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        registry = request.app.state.stat_logger.registry
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    if os.environ.get("MINI_VLLM_SERVER_DEV_MODE") == "1":
        # Development-only routes, as upstream's VLLM_SERVER_DEV_MODE adds: the engine core's own
        # counters (tests read them to prove that aborted requests left no block behind).

        @app.get("/engine_stats")
        async def engine_stats(request: Request) -> JSONResponse:
            engine: AsyncLLM = request.app.state.engine
            if engine.errored:
                raise engine.dead_error
            return JSONResponse(await engine.get_stats())

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache(request: Request) -> JSONResponse:
            engine: AsyncLLM = request.app.state.engine
            return JSONResponse({"reset": await engine.reset_prefix_cache()})

    @app.get("/v1/models")
    async def show_models(request: Request) -> ModelList:
        engine: AsyncLLM = request.app.state.engine
        name = request.app.state.served_model_name
        return ModelList(
            data=[
                ModelCard(
                    id=name, root=str(engine.model_source), max_model_len=engine.max_model_len
                )
            ]
        )

    @app.post("/v1/completions")
    async def create_completion(body: CompletionRequest, request: Request) -> Response:
        serving = _serving(request)
        return await _respond(
            request, serving.create_completion(body, request.headers.get("X-Request-Id"))
        )

    @app.post("/v1/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
        serving = _serving(request)
        return await _respond(
            request, serving.create_chat_completion(body, request.headers.get("X-Request-Id"))
        )

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
        return _serving(request).tokenize(body)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
        return _serving(request).detokenize(body)

    return app


async def _respond(request: Request, pending: Awaitable[Any]) -> Response:
    """Await the handler, abandoning it if the client hangs up first (upstream's
    ``with_cancellation``): cancelling it closes the request generators, which aborts the
    requests in the engine core and frees their blocks."""
    result = await _with_cancellation(request, pending)
    if result is None:
        return Response(status_code=499)  # the client is gone; nobody reads this
    if hasattr(result, "__aiter__"):
        return StreamingResponse(result, media_type="text/event-stream")
    return JSONResponse(result.model_dump())


async def _with_cancellation(request: Request, pending: Awaitable[Any]) -> Any:
    handler = asyncio.ensure_future(pending)

    async def wait_disconnect() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        done, _ = await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        handler.cancel()
        raise
    finally:
        watcher.cancel()
    if handler in done:
        return handler.result()
    handler.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await handler
    return None


def run_server(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; uvicorn's shutdown runs the lifespan's engine shutdown."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        app = build_app(args)
    except ValueError as exc:  # a bad option: say which, no traceback, no engine started
        logger.error("%s", exc)
        return 2
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        # Open streams get this long to finish after SIGTERM before they are cut.
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1
