"""The SDK-free half of telemetry: `TelemetryConfig`, `RequestSpan` and `TelemetryBase`, the
interface every telemetry implements (each method a no-op here).

`base.Telemetry` (off, and the factory `from_settings`, which loads otel) and `otel.FileTelemetry`
(on) both build on this module, so otel never imports base: no circle.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from ortserve.telemetry import names as n
from ortserve.telemetry.files import Limits

StatsFn = Callable[[], Any]  # returns ortserve.types.EngineStats (or anything with its fields)


@dataclass(frozen=True)
class TelemetryConfig:
    directory: Path
    content: bool = False
    limits: Limits = field(default_factory=Limits)
    metric_interval_s: float = 30.0
    span_delay_s: float = 2.0
    max_queue: int = 8192
    service_name: str = "ortserve"
    access_log: bool = True  # one OTel log record per request, correlated with its span


class TelemetryBase:
    """What the server calls on a telemetry; every method is a cheap no-op (telemetry off)."""

    enabled = False
    content = False

    def request_span(self, route: str, *, model: str | None = None, provider: str | None = None,
                     execution_provider: str | None = None, request_id: str | None = None,
                     **attributes: Any) -> RequestSpan:
        return RequestSpan(None, route, {})

    def observe_engine(self, stats: StatsFn, *, model: str | None = None) -> None:
        return None

    def install_logging(self, logger: logging.Logger | None = None, level: int = logging.NOTSET) -> None:
        return None

    def force_flush(self, timeout_s: float = 10.0) -> None:
        return None

    def shutdown(self) -> None:
        return None


class SpanOwner(Protocol):
    """What a live RequestSpan needs from FileTelemetry (keeps this module SDK-free)."""

    content: bool

    def _begin(self, span: RequestSpan) -> None: ...
    def _mark_error(self, span: RequestSpan, message: str | None) -> None: ...
    def _end(self, span: RequestSpan, exc: BaseException | None, duration: float) -> None: ...


_ALIASES = {"model": n.MODEL, "provider": n.PROVIDER, "execution_provider": n.EXECUTION_PROVIDER,
            "request_id": n.REQUEST_ID}
_CANCELLED = (asyncio.CancelledError, GeneratorExit)


class RequestSpan:
    """One request's span. Use as a context manager; report the outcome with `finish()`, or
    with `add_result()` per answer plus `set_status_code()` (what the ASGI middleware does).
    Leaving the block with an exception records it (status from the error's `.status`;
    499 and finish_reason "abort" for a cancelled or disconnected request)."""

    def __init__(self, owner: SpanOwner | None, route: str, attrs: dict[str, Any]) -> None:
        self.owner = owner
        self.route = route
        self.attrs = attrs
        self.status = 200
        self.finish_reason: str | None = None
        self.input_tokens = 0
        self.output_tokens = 0
        self.ttft: float | None = None
        self.tpot: float | None = None
        self.finished = False
        self.otel_span: Any = None   # the SDK span while open (set by the owner)
        self.context_token: Any = None
        self._tpot_weight = 0
        self._t0 = 0.0

    @property
    def trace_id(self) -> str:
        """Hex trace id ("" when telemetry is off), e.g. for a response header."""
        if self.otel_span is None:
            return ""
        return f"{self.otel_span.get_span_context().trace_id:032x}"

    def __enter__(self) -> RequestSpan:  # noqa: PYI034
        if self.owner is not None:
            self.owner._begin(self)
            self._t0 = time.perf_counter()
        return self

    def _set(self, key: str, value: Any) -> None:
        if self.otel_span is not None:
            self.otel_span.set_attribute(key, value)

    def set(self, **attributes: Any) -> None:
        """Late attributes, by keyword (model, provider, execution_provider, request_id) or
        full attribute name via **{"name": value}."""
        for key, value in attributes.items():
            if value is not None:
                self.attrs[_ALIASES.get(key, key)] = value
                self._set(_ALIASES.get(key, key), value)

    def record_content(self, prompt: Any = None, completion: str | None = None) -> None:
        """Prompt (text or chat messages) and completion: kept only with telemetry_content."""
        if self.owner is None or not self.owner.content:
            return
        if prompt is not None:
            self._set(n.PROMPT, prompt if isinstance(prompt, str) else json.dumps(prompt, ensure_ascii=False))
        if completion is not None:
            self._set(n.COMPLETION, completion)

    def add_result(self, metrics: Any, finish_reason: str | None = None) -> None:
        """Fold in one answer's `ortserve.types.Metrics` (once per choice when n > 1): input
        tokens are the prompt's, output tokens add up, TTFT is the earliest, TPOT the
        output-weighted mean; "length"/"abort"/"error" outrank "stop" as finish reason."""
        if metrics is None:
            return
        out = int(getattr(metrics, "output_tokens", 0) or 0)
        tpot = getattr(metrics, "tpot", None)
        if tpot is not None:
            weight = self._tpot_weight + max(out, 1)
            self.tpot = ((self.tpot or 0.0) * self._tpot_weight + tpot * max(out, 1)) / weight
            self._tpot_weight = weight
        ttft = getattr(metrics, "ttft", None)
        if ttft is not None:
            self.ttft = ttft if self.ttft is None else min(self.ttft, ttft)
        self.input_tokens = max(self.input_tokens, int(getattr(metrics, "input_tokens", 0) or 0))
        self.output_tokens += out
        if finish_reason and self.finish_reason in (None, "stop"):
            self.finish_reason = finish_reason

    def set_status_code(self, status: int) -> None:
        """The HTTP status sent."""
        self.status = int(status)

    def finish(self, *, input_tokens: int = 0, output_tokens: int = 0, ttft: float | None = None,
               tpot: float | None = None, finish_reason: str | None = None, status: int = 200,
               error: BaseException | str | None = None) -> None:
        """The outcome. Times in seconds; status is the HTTP status code returned."""
        self.finished = True
        self.input_tokens, self.output_tokens = int(input_tokens), int(output_tokens)
        self.ttft, self.tpot, self.finish_reason, self.status = ttft, tpot, finish_reason, int(status)
        if self.otel_span is None or self.owner is None:
            return
        self._set(n.INPUT_TOKENS, self.input_tokens)
        self._set(n.OUTPUT_TOKENS, self.output_tokens)
        if ttft is not None:
            self._set(n.TTFT, float(ttft))
        if tpot is not None:
            self._set(n.TPOT, float(tpot))
        if finish_reason:
            self._set(n.FINISH_REASONS, [finish_reason])
        self._set(n.STATUS_CODE, self.status)
        failed = self.status >= 400 or finish_reason == "error" or error is not None
        self._set(n.STATUS, "error" if failed else "ok")
        if error is not None:
            self._set(n.ERROR_TYPE, type(error).__name__ if isinstance(error, BaseException) else str(error))
        if self.status >= 500 or finish_reason == "error":
            self.owner._mark_error(self, str(error) if error else None)

    def _finish_as_is(self, **changes: Any) -> None:
        values: dict[str, Any] = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                                  "ttft": self.ttft, "tpot": self.tpot,
                                  "finish_reason": self.finish_reason, "status": self.status}
        self.finish(**{**values, **changes})

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self.finished:
            if isinstance(exc, _CANCELLED):
                self._finish_as_is(finish_reason="abort", status=499)
            elif exc is not None:
                self._finish_as_is(finish_reason="error", status=int(getattr(exc, "status", 500)), error=exc)
            else:
                self._finish_as_is()
        if self.owner is not None and self.otel_span is not None:
            self.owner._end(self, None if isinstance(exc, _CANCELLED) else exc,
                            time.perf_counter() - self._t0)
