"""create_app: the FastAPI application. Routes stay thin: parse, call the engine, answer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ortserve import faults
from ortserve.config import Settings
from ortserve.engine import AsyncEngine
from ortserve.errors import (
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    OrtServeError,
    PayloadTooLarge,
    StorageFull,
    Unavailable,
    disk_full,
)
from ortserve.server import rag_access
from ortserve.server.api import admin as routes_admin
from ortserve.server.api import anthropic_messages as routes_messages
from ortserve.server.api import audio as routes_audio
from ortserve.server.api import embeddings as routes_embeddings
from ortserve.server.api import files as routes_files
from ortserve.server.api import infill as routes_infill
from ortserve.server.api import models as routes_models
from ortserve.server.api import ollama as routes_ollama
from ortserve.server.api import ollama_models as routes_ollama_models
from ortserve.server.api import ollama_wire
from ortserve.server.api import openai_chat as routes_openai
from ortserve.server.api import openai_completions as routes_completions
from ortserve.server.api import openai_responses as routes_responses
from ortserve.server.api import rerank as routes_rerank
from ortserve.server.api import seed as routes_seed
from ortserve.server.api import tokenize as routes_tokenize
from ortserve.server.api import ui as routes_ui
from ortserve.server.api import vector_stores as routes_vector_stores
from ortserve.server.manager import ModelManager
from ortserve.server.sse import ClientDisconnected, SSEPings
from ortserve.server.state import ServerState
from ortserve.server.tenancy import Auth
from ortserve.telemetry import Telemetry, TelemetryMiddleware, span_of

log = logging.getLogger("ortserve.server")
KNOWN_ROUTES = {"/healthz", "/metrics", "/v1/chat", "/v1/chat/stream", "/v1/chat/completions",
                "/v1/completions", "/v1/responses", "/v1/messages", "/v1/models", "/v1/admin/ps", "/v1/admin/load", "/v1/admin/unload",
                "/v1/embeddings", "/v1/files", "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/vector_stores", "/api/chat", "/api/generate", "/api/embed",
                "/tokenize", "/detokenize", "/infill", "/v1/responses/input_tokens"}

UPLOAD_PATHS = ("/v1/files", "/v1/audio/transcriptions", "/v1/audio/translations")   # max_upload_bytes


def error_body(err: OrtServeError, path: str = "") -> dict[str, Any]:
    """The error in the shape of the API the path belongs to: Anthropic's on /v1/messages, Ollama's on
    /api/*, else OpenAI's."""
    if ollama_wire.is_ollama_path(path):
        return ollama_wire.ollama_error(err)
    if path in routes_rerank.PATHS:  # Cohere's shape, with the OpenAI error object beside it
        return routes_rerank.rerank_error(err)
    return routes_messages.anthropic_error(err) if routes_messages.is_messages_path(path) else err.to_openai()


def error_response(err: OrtServeError, headers: dict[str, str] | None = None, path: str = "") -> JSONResponse:
    headers = dict(headers or {})
    if err.status == 429 or err.retry_after is not None:
        headers["Retry-After"] = str(math.ceil(err.retry_after or 1))
    return JSONResponse(error_body(err, path), status_code=err.status, headers=headers or None)


def http_error(req: Request, exc: StarletteHTTPException) -> OrtServeError:
    """Starlette's own errors (unknown path, wrong method, ...) as ortserve errors."""
    if exc.status_code == 404:
        return NotFound(f"no route {req.method} {req.url.path}", code="unknown_url")
    if exc.status_code == 405:
        allowed = ", ".join(allowed_methods(req))
        return MethodNotAllowed(f"{req.method} is not allowed on {req.url.path}"
                                + (f" (allowed: {allowed})" if allowed else ""))
    if exc.status_code == 413:
        return PayloadTooLarge(str(exc.detail))
    err = InvalidRequest(str(exc.detail)) if exc.status_code < 500 else OrtServeError(str(exc.detail))
    err.status = exc.status_code
    return err


def allowed_methods(req: Request) -> list[str]:
    """Every method some route serves at this path (Starlette's Allow names only the first route
    that matched the path, and /v1/files has a GET route and a POST route)."""
    from starlette.routing import Match

    allowed = []
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        scope = {**req.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in req.app.router.routes):
            allowed.append(method)
    return allowed


def create_app(settings: Settings, *, engine: AsyncEngine | None = None, model_dir: Path | None = None,
               model_id: str | None = None) -> FastAPI:
    """An app serving ``engine``, or the model at ``model_dir`` loaded in the background."""
    state = ServerState(settings=settings, model_dir=str(model_dir or ""))
    _recover(settings)
    state.telemetry = Telemetry.from_settings(settings)
    state.manager = ModelManager(settings)
    state.metrics.watch_models(state.manager)
    _rag_parts(state)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.telemetry.install_logging()
        loader = asyncio.ensure_future(_load(state, model_dir, model_id)) if engine is None else None
        if engine is not None:
            await state.manager.adopt(engine, engine.model.dir, engine.model_id)  # type: ignore[union-attr]
            _started(state, engine)
        state.manager.start()  # type: ignore[union-attr]
        rag_access.start_rag(state)   # resumes vector-store files left in_progress
        try:
            yield
        finally:
            rag_access.stop_rag(state)
            if loader is not None:
                loader.cancel()
            if state.router is not None:
                await state.router.aclose()
            if state.responses is not None:
                state.responses.close()
            await state.manager.close()  # type: ignore[union-attr]
            if state.telemetry is not None:
                state.telemetry.shutdown()

    app = FastAPI(title="ortserve", version="0.1.0", lifespan=lifespan)
    app.state.ortserve = state
    app.include_router(routes_seed.router)
    app.include_router(routes_models.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_completions.router)
    app.include_router(routes_responses.router)
    app.include_router(routes_rerank.router)
    app.include_router(routes_messages.router)
    app.include_router(routes_admin.router)
    app.include_router(routes_embeddings.router)
    app.include_router(routes_audio.router)
    app.include_router(routes_files.router)
    app.include_router(routes_vector_stores.router)
    app.include_router(routes_ollama.router)
    app.include_router(routes_ollama_models.router)
    app.include_router(routes_tokenize.router)
    app.include_router(routes_infill.router)
    if settings.ui:
        app.include_router(routes_ui.router)

    @app.exception_handler(OrtServeError)
    async def _ortserve_error(req: Request, err: OrtServeError) -> JSONResponse:
        return error_response(err, path=req.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers = {k: v for k, v in headers.items() if k.lower() != "allow"}
            headers["Allow"] = ", ".join(allowed_methods(req))
        return error_response(http_error(req, exc), headers=headers, path=req.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(req: Request, err: RequestValidationError) -> JSONResponse:
        return error_response(validation_to_error(err), path=req.url.path)

    @app.exception_handler(OSError)
    @app.exception_handler(sqlite3.Error)
    async def _storage_error(req: Request, exc: Exception) -> JSONResponse:
        if not disk_full(exc):
            raise exc
        log.error("%s %s: the disk is full (%s)", req.method, req.url.path, exc)
        return error_response(StorageFull(f"the disk under {settings.home} is full; nothing was stored",
                                          hint="free space there and retry"), path=req.url.path)

    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"],
                           allow_headers=["*"])
    app.add_middleware(SSEPings, interval=settings.sse_ping_seconds)
    app.add_middleware(GuardMiddleware, state=state)
    app.add_middleware(TelemetryMiddleware, telemetry=state.telemetry,
                       route_of=lambda path: path if path in KNOWN_ROUTES else "other")
    return app


def _recover(settings: Settings) -> None:
    """Arm the test-only crash point (faults.py) and sweep what a killed process left in the model
    store (the RAG store sweeps its own when it opens)."""
    from ortserve.models.store import ModelStore

    faults.arm(settings.crash_at)
    swept = ModelStore(settings.store_dir).sweep()
    if swept:
        log.debug("model store: swept leftovers of %s", ", ".join(swept))


def _rag_parts(state: ServerState) -> None:
    """The embedding holder and the RAG store (issue 16); both open lazily."""
    from ortserve.models.store import ModelStore
    from ortserve.server.embed_holder import EmbeddingHolder

    state.embedder = EmbeddingHolder(ModelStore(state.settings.store_dir), state.settings.embedding_model)
    state.embedder.manager = state.manager  # embedding models share the chat models' budget and ps
    from ortserve.server.speech import SpeechHolder  # Whisper (docs/audio.md): its own queue beside chat

    s = state.settings
    state.speech = SpeechHolder(ModelStore(s.store_dir), s.audio_model, s.audio_concurrency, s.audio_queue,
                                s.audio_threads)
    state.speech.manager = state.manager
    state.speech.bind_metrics(state.metrics.registry)
    from ortserve.server.vision import VisionHolder  # images on the chat APIs (docs/vision.md)
    from ortserve.vision.images import ImageLimits

    state.vision = VisionHolder(ModelStore(s.store_dir), ImageLimits(s.image_max_bytes, s.image_max_pixels,
                                                                     s.image_max_images, s.image_dir))
    state.vision.manager = state.manager


def validation_to_error(err: RequestValidationError) -> OrtServeError:
    from ortserve.errors import InvalidRequest

    first = err.errors()[0] if err.errors() else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        return InvalidRequest("the request body is not valid JSON", code="invalid_json")
    param = ".".join(loc) or None
    msg = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":  # the request contract: no silently ignored fields
        return InvalidRequest(f"Unrecognized request argument supplied: {param}", param=param,
                              code="unknown_parameter")
    if first.get("type") == "missing":
        return InvalidRequest(f"'{param}' is required", param=param, code="missing_required_parameter")
    return InvalidRequest(f"'{param}': {msg}" if param else msg, param=param)


def _started(state: ServerState, engine: AsyncEngine) -> None:
    """The pinned start model is up: the default engine, its metrics, the router over the manager."""
    state.engine = engine
    state.metrics.bind(engine.stats)
    from ortserve.providers.local import LocalProvider
    from ortserve.router.router import Router

    manager = state.manager
    local = LocalProvider(engine, engines=manager.get if manager is not None else None)
    state.router = Router.from_settings(state.settings, local=local)
    if state.telemetry is not None:
        state.telemetry.observe_engine(engine.stats, model=engine.model_id)


async def _load(state: ServerState, model_dir: Path | None, model_id: str | None) -> None:
    from ortserve.server.vision_pinned import is_vision_dir, start_pinned_vision

    try:
        if model_dir is None:
            raise OrtServeError("no model given")
        assert state.manager is not None
        if is_vision_dir(model_dir):   # a vision start model: its batched engine is the default (no text engine)
            engine = await start_pinned_vision(state, Path(model_dir), model_id or Path(model_dir).name)
        else:
            engine = await state.manager.preload(Path(model_dir), model_id or Path(model_dir).name)
        _started(state, engine)
    except OrtServeError as exc:
        state.load_error = exc.one_line()
        log.error("model failed to load: %s", state.load_error)
    except Exception as exc:
        state.load_error = f"{type(exc).__name__}: {exc}"
        log.exception("model failed to load")


class GuardMiddleware:
    """API key, body size, and draining — before any route runs (pure ASGI: streams pass through)."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state
        self.auth = Auth(state.settings)   # ORTSERVE_API_KEY and the key file (server/tenancy.py)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = self.state.settings
        path = scope.get("path", "")
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.state.draining and path != "/healthz":
            await _send(send, path, Unavailable("the server is shutting down"))
            return
        public = path == "/healthz" or (settings.ui and routes_ui.is_public(path, scope.get("method", "")))
        if not public and scope.get("method") != "OPTIONS":
            refused = self.auth.check(scope, headers)   # 401 a wrong key, 403 a user key on admin routes
            if refused is not None:
                await _send(send, path, refused)
                return
        # uploads (POST /v1/files) have their own, larger limit (docs/rag.md)
        limit = settings.max_upload_bytes + 65536 if path in UPLOAD_PATHS else settings.max_body_bytes
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _send(send, path, PayloadTooLarge(f"request body of {length} bytes exceeds the limit of {limit}"))
            return
        received = 0
        status = 500

        async def limited_receive() -> Message:
            nonlocal received
            msg = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > limit:
                    raise _TooLarge(413, f"request body exceeds the limit of {limit} bytes")
            return msg

        async def counting_send(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, limited_receive, counting_send)
        except _TooLarge as exc:
            status = 413
            await _send(send, path, PayloadTooLarge(exc.detail))
        except ClientDisconnected:
            # The client left a non-streaming request: the engine work was aborted; nobody is
            # there to answer. Counted (and traced) as a cancel, 499, not as a server error.
            status = 499
            span = span_of(scope)
            if not span.finished:
                span.finish(status=499, finish_reason="abort")
        finally:
            route = path if path in KNOWN_ROUTES else "other"
            self.state.metrics.requests.labels(route, str(status)).inc()


class _TooLarge(HTTPException):
    """Raised from receive(): FastAPI re-raises HTTPExceptions from body reading (anything else
    becomes a 400), so a chunked body over the limit reaches the 413 handler."""


async def _send(send: Send, path: str, err: OrtServeError) -> None:
    import json

    body = json.dumps(error_body(err, path)).encode()
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

