"""ASGI middleware: one request span per HTTP request, ended when the last byte is sent.

    app.add_middleware(TelemetryMiddleware, telemetry=tel)
    ...
    span_of(request).set(model=engine.model_id, provider="local", execution_provider="cpu")
    span_of(request).add_result(answer.metrics, answer.finish_reason)

Pure ASGI (no BaseHTTPMiddleware), so streamed responses pass through untouched and the
span covers the whole stream; route code and the stream body run inside the span's
context, so their log lines carry its trace id. No FastAPI import: telemetry stays a leaf.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ortserve.telemetry.base import RequestSpan, Telemetry, TelemetryBase

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

STATE_KEY = "ortserve_span"
_NOOP = Telemetry()


class TelemetryMiddleware:
    def __init__(self, app: ASGIApp, telemetry: TelemetryBase,
                 route_of: Callable[[str], str] | None = None,
                 skip: frozenset[str] = frozenset({"/metrics", "/healthz"})) -> None:
        """`route_of` maps a path to a bounded route label (default: the path itself);
        paths in `skip` (Prometheus scrapes, health probes) get no span."""
        self.app = app
        self.telemetry = telemetry
        self.route_of = route_of or (lambda path: path)
        self.skip = skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not self.telemetry.enabled or path in self.skip:
            await self.app(scope, receive, send)
            return
        route = self.route_of(path)
        with self.telemetry.request_span(route, **{"http.request.method": scope.get("method", "")}) as span:
            scope.setdefault("state", {})[STATE_KEY] = span

            async def send_status(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set_status_code(message["status"])
                await send(message)

            await self.app(scope, receive, send_status)


def span_of(request: Any) -> RequestSpan:
    """The current request's span (a no-op span when telemetry is off or not installed).
    Accepts a Starlette/FastAPI Request or an ASGI scope."""
    scope = request if isinstance(request, MutableMapping) else getattr(request, "scope", {})
    span = scope.get("state", {}).get(STATE_KEY)
    return span if isinstance(span, RequestSpan) else _NOOP.request_span("")
