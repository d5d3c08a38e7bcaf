"""create_app: the FastAPI application. Routes stay thin: parse, call the engine, answer."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ortserve.config import Settings
from ortserve.engine import AsyncEngine
from ortserve.errors import OrtServeError, PayloadTooLarge, Unauthorized, Unavailable
from ortserve.server import routes_openai, routes_seed
from ortserve.server.state import ServerState
from ortserve.telemetry import Telemetry, TelemetryMiddleware

log = logging.getLogger("ortserve.server")
KNOWN_ROUTES = {"/healthz", "/metrics", "/v1/chat", "/v1/chat/stream", "/v1/chat/completions",
                "/v1/completions", "/v1/models"}


def error_response(err: OrtServeError) -> JSONResponse:
    headers = {"Retry-After": "1"} if err.status == 429 else None
    return JSONResponse(err.to_openai(), status_code=err.status, headers=headers)


def create_app(settings: Settings, *, engine: AsyncEngine | None = None, model_dir: Path | None = None,
               model_id: str | None = None) -> FastAPI:
    """An app serving ``engine``, or the model at ``model_dir`` loaded in the background."""
    state = ServerState(settings=settings, engine=engine, model_dir=str(model_dir or ""))
    state.telemetry = Telemetry.from_settings(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.telemetry.install_logging()
        loader = asyncio.ensure_future(_load(state, model_dir, model_id)) if engine is None else None
        if engine is not None:
            await _started(state, engine)
        try:
            yield
        finally:
            if loader is not None:
                loader.cancel()
            if state.router is not None:
                await state.router.aclose()
            if state.engine is not None:
                await state.engine.stop()
            if state.telemetry is not None:
                state.telemetry.shutdown()

    app = FastAPI(title="ortserve", version="0.1.0", lifespan=lifespan)
    app.state.ortserve = state
    app.include_router(routes_seed.router)
    app.include_router(routes_openai.router)

    @app.exception_handler(OrtServeError)
    async def _ortserve_error(_req: Request, err: OrtServeError) -> JSONResponse:
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_req: Request, err: RequestValidationError) -> JSONResponse:
        return error_response(validation_to_error(err))

    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["*"],
                           allow_headers=["*"])
    app.add_middleware(GuardMiddleware, state=state)
    app.add_middleware(TelemetryMiddleware, telemetry=state.telemetry,
                       route_of=lambda path: path if path in KNOWN_ROUTES else "other")
    return app


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


async def _started(state: ServerState, engine: AsyncEngine) -> None:
    await engine.start()
    state.engine = engine
    state.metrics.bind(engine.stats)
    from ortserve.router.router import Router

    state.router = Router.from_settings(state.settings, local=engine)
    if state.telemetry is not None:
        state.telemetry.observe_engine(engine.stats, model=engine.model_id)


async def _load(state: ServerState, model_dir: Path | None, model_id: str | None) -> None:
    try:
        if model_dir is None:
            raise OrtServeError("no model given")
        engine = await asyncio.to_thread(AsyncEngine.load, model_dir, state.settings, model_id)
        await _started(state, engine)
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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = self.state.settings
        path = scope.get("path", "")
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.state.draining and path != "/healthz":
            await _send(send, Unavailable("the server is shutting down"))
            return
        if settings.api_key and path != "/healthz" and scope.get("method") != "OPTIONS":
            given = headers.get("authorization", "")
            token = given[7:] if given.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(token.encode(), settings.api_key.encode()):
                await _send(send, Unauthorized("missing or wrong API key (Authorization: Bearer ...)"))
                return
        limit = settings.max_body_bytes
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _send(send, PayloadTooLarge(f"request body of {length} bytes exceeds the limit of {limit}"))
            return
        received = 0
        status = 500

        async def limited_receive() -> Message:
            nonlocal received
            msg = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > limit:
                    raise _TooLarge()
            return msg

        async def counting_send(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, limited_receive, counting_send)
        except _TooLarge:
            status = 413
            await _send(send, PayloadTooLarge(f"request body exceeds the limit of {limit} bytes"))
        finally:
            route = path if path in KNOWN_ROUTES else "other"
            self.state.metrics.requests.labels(route, str(status)).inc()


class _TooLarge(Exception):
    pass


async def _send(send: Send, err: OrtServeError) -> None:
    import json

    body = json.dumps(err.to_openai()).encode()
    await send({"type": "http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

