"""The telemetry facade the server calls: spans per request, engine gauges, correlated logs.

    tel = Telemetry.from_settings(settings)        # a no-op object when settings.telemetry is off
    tel.install_logging()                          # root logger -> OTel logs with trace ids
    tel.observe_engine(engine.stats, model=engine.model_id)
    with tel.request_span("/v1/chat/completions", model=m, provider="local",
                          execution_provider="cpu") as span:
        ...
        span.finish(input_tokens=12, output_tokens=30, ttft=0.05, tpot=0.01,
                    finish_reason="stop", status=200)
    tel.shutdown()                                 # flushes everything

All exporting happens on SDK background threads (BatchSpanProcessor, BatchLogRecordProcessor,
PeriodicExportingMetricReader) writing OTLP/JSON lines to rotating files (files.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind, Status, StatusCode

from ortserve import __version__
from ortserve.telemetry import names as n
from ortserve.telemetry.exporters import FileLogExporter, FileMetricExporter, FileSpanExporter
from ortserve.telemetry.files import Health, Limits, RotatingWriter
from ortserve.telemetry.logs import TraceContextFilter, TraceLogHandler

log = logging.getLogger("ortserve.telemetry")
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


class Telemetry:
    """Telemetry switched off: every method is a cheap no-op. `from_settings` returns the
    real thing (`FileTelemetry`) when `settings.telemetry` is true."""

    enabled = False
    content = False

    @staticmethod
    def from_settings(settings: Any, **overrides: Any) -> Telemetry:
        """`overrides` are TelemetryConfig fields (limits, metric_interval_s, ...)."""
        if not getattr(settings, "telemetry", False):
            return Telemetry()
        config = TelemetryConfig(directory=settings.telemetry_path,
                                 content=bool(settings.telemetry_content), **overrides)
        return FileTelemetry(config)

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


class FileTelemetry(Telemetry):
    enabled = True

    def __init__(self, config: TelemetryConfig) -> None:
        self.config = config
        self.content = config.content
        self.directory = config.directory
        self.health = Health()
        resource = Resource({
            "service.name": config.service_name, "service.version": __version__,
            "service.instance.id": str(uuid.uuid4()), "host.name": socket.gethostname(),
            "process.pid": os.getpid(),
        })

        def writer(signal: str) -> RotatingWriter:
            return RotatingWriter(config.directory, signal, config.limits, self.health)

        self.writers = {s: writer(s) for s in ("traces", "metrics", "logs")}
        self.tracer_provider = TracerProvider(resource=resource, sampler=ALWAYS_ON)
        self.tracer_provider.add_span_processor(BatchSpanProcessor(
            FileSpanExporter(self.writers["traces"]), max_queue_size=config.max_queue,
            schedule_delay_millis=config.span_delay_s * 1000))
        self.tracer = self.tracer_provider.get_tracer(n.SCOPE, __version__)

        self._reader = PeriodicExportingMetricReader(
            FileMetricExporter(self.writers["metrics"]),
            export_interval_millis=config.metric_interval_s * 1000)
        self.meter_provider = MeterProvider(resource=resource, metric_readers=[self._reader])
        self._instruments()

        self.logger_provider = LoggerProvider(resource=resource)
        self.logger_provider.add_log_record_processor(BatchLogRecordProcessor(
            FileLogExporter(self.writers["logs"]), max_queue_size=config.max_queue,
            schedule_delay_millis=config.span_delay_s * 1000))
        self.log_handler = TraceLogHandler(self.logger_provider)
        self.log_filter = TraceContextFilter()
        self._installed: list[logging.Logger] = []
        self._engines: list[tuple[StatsFn, str | None]] = []
        self._engine_gauges = False
        self._lock = threading.Lock()
        self._closed = False

    def _instruments(self) -> None:
        meter = self.meter_provider.get_meter(n.SCOPE, __version__)
        self.meter = meter
        self.m_requests = meter.create_counter(n.M_REQUESTS, "{request}", "Requests served")
        self.m_duration = meter.create_histogram(
            n.M_DURATION, "s", "Request duration", explicit_bucket_boundaries_advisory=n.DURATION_BOUNDS)
        self.m_ttft = meter.create_histogram(
            n.M_TTFT, "s", "Time to first token", explicit_bucket_boundaries_advisory=n.TTFT_BOUNDS)
        self.m_tpot = meter.create_histogram(
            n.M_TPOT, "s", "Time per output token after the first",
            explicit_bucket_boundaries_advisory=n.TPOT_BOUNDS)
        self.m_tokens = meter.create_counter(n.M_TOKENS, "{token}", "Input and output tokens")

    # -- request spans

    def request_span(self, route: str, *, model: str | None = None, provider: str | None = None,
                     execution_provider: str | None = None, request_id: str | None = None,
                     **attributes: Any) -> RequestSpan:
        attrs = {n.ROUTE: route, n.MODEL: model, n.PROVIDER: provider,
                 n.EXECUTION_PROVIDER: execution_provider, n.REQUEST_ID: request_id, **attributes}
        return RequestSpan(self, route, attrs)

    def _record(self, span: RequestSpan, duration: float) -> None:
        base = {n.ROUTE: span.route, n.MODEL: span.attrs.get(n.MODEL) or "",
                n.PROVIDER: span.attrs.get(n.PROVIDER) or ""}
        self.m_requests.add(1, {**base, n.STATUS_CODE: span.status,
                                n.FINISH_REASON: span.finish_reason or ""})
        self.m_duration.record(duration, base)
        if span.ttft is not None:
            self.m_ttft.record(span.ttft, base)
        if span.tpot is not None:
            self.m_tpot.record(span.tpot, base)
        if span.input_tokens:
            self.m_tokens.add(span.input_tokens, {**base, n.TOKEN_TYPE: "input"})
        if span.output_tokens:
            self.m_tokens.add(span.output_tokens, {**base, n.TOKEN_TYPE: "output"})

    # -- engine gauges

    def observe_engine(self, stats: StatsFn, *, model: str | None = None) -> None:
        """Sample `stats()` at each metric collection (background thread): waiting (queue
        depth), running, tokens/s, output tokens so far, KV-cache usage when reported."""
        with self._lock:
            self._engines.append((stats, model))
            if self._engine_gauges:
                return
            self._engine_gauges = True
        field_of = {n.M_WAITING: "waiting", n.M_RUNNING: "running", n.M_TPS: "tokens_per_second",
                    n.M_KV: "kv_cache_usage", n.M_ENGINE_OUTPUT: "total_output_tokens"}

        def callback(metric: str) -> Callable[[CallbackOptions], list[Observation]]:
            def observe(_: CallbackOptions) -> list[Observation]:
                out = []
                for fn, model_id in list(self._engines):
                    try:
                        value = getattr(fn(), field_of[metric], None)
                    except Exception:  # a stopped engine must not break collection
                        log.debug("engine stats failed", exc_info=True)
                        continue
                    if isinstance(value, (int, float)):
                        out.append(Observation(value, {n.MODEL: model_id or ""}))
                return out
            return observe

        m = self.meter
        m.create_observable_gauge(n.M_WAITING, [callback(n.M_WAITING)], "{request}", "Requests queued")
        m.create_observable_gauge(n.M_RUNNING, [callback(n.M_RUNNING)], "{request}", "Requests decoding")
        m.create_observable_gauge(n.M_TPS, [callback(n.M_TPS)], "{token}/s", "Engine output tokens/s")
        m.create_observable_gauge(n.M_KV, [callback(n.M_KV)], "1", "KV-cache fraction in use")
        m.create_observable_counter(n.M_ENGINE_OUTPUT, [callback(n.M_ENGINE_OUTPUT)], "{token}",
                                    "Output tokens generated by the engine")

    # -- logs

    def install_logging(self, logger: logging.Logger | None = None, level: int = logging.NOTSET) -> None:
        """Send `logger`'s records (default: the root logger) to the telemetry log files with
        the current trace/span ids, and add `record.trace_id`/`record.span_id` for formatters."""
        target = logger or logging.getLogger()
        self.log_handler.setLevel(level)
        if self.log_handler not in target.handlers:
            target.addHandler(self.log_handler)
            target.addFilter(self.log_filter)
            self._installed.append(target)

    # -- lifecycle

    def force_flush(self, timeout_s: float = 10.0) -> None:
        ms = int(timeout_s * 1000)
        self.tracer_provider.force_flush(ms)
        self.logger_provider.force_flush(ms)
        self.meter_provider.force_flush(ms)

    def shutdown(self) -> None:
        """Flush and stop the exporters; safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for target in self._installed:
            target.removeHandler(self.log_handler)
            target.removeFilter(self.log_filter)
        self.tracer_provider.shutdown()
        self.logger_provider.shutdown()
        self.meter_provider.shutdown()


class RequestSpan:
    """One request's span. Use as a context manager; call `finish()` with the outcome.
    Leaving the block with an exception records it (status from the error's `.status`,
    499 / finish_reason "abort" for a cancelled or disconnected request)."""

    def __init__(self, owner: FileTelemetry | None, route: str, attrs: dict[str, Any]) -> None:
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
        self._span: trace.Span | None = None
        self._token: object | None = None
        self._t0 = 0.0

    @property
    def trace_id(self) -> str:
        """Hex trace id ("" when telemetry is off), e.g. for a response header."""
        if self._span is None:
            return ""
        return f"{self._span.get_span_context().trace_id:032x}"

    def __enter__(self) -> RequestSpan:  # noqa: PYI034
        if self.owner is not None:
            attrs = {k: v for k, v in self.attrs.items() if v is not None}
            self._span = self.owner.tracer.start_span(self.route, kind=SpanKind.SERVER, attributes=attrs)
            self._token = otel_context.attach(trace.set_span_in_context(self._span))
            self._t0 = time.perf_counter()
        return self

    def set(self, **attributes: Any) -> None:
        """Late attributes, by keyword (model, provider, execution_provider) or full name."""
        alias = {"model": n.MODEL, "provider": n.PROVIDER, "execution_provider": n.EXECUTION_PROVIDER,
                 "request_id": n.REQUEST_ID}
        for key, value in attributes.items():
            if value is None:
                continue
            self.attrs[alias.get(key, key)] = value
            if self._span is not None:
                self._span.set_attribute(alias.get(key, key), value)

    def record_content(self, prompt: Any = None, completion: str | None = None) -> None:
        """Prompt (text or chat messages) and completion: kept only with telemetry_content."""
        if self._span is None or self.owner is None or not self.owner.content:
            return
        if prompt is not None:
            self._span.set_attribute(n.PROMPT, prompt if isinstance(prompt, str)
                                     else json.dumps(prompt, ensure_ascii=False))
        if completion is not None:
            self._span.set_attribute(n.COMPLETION, completion)

    def finish(self, *, input_tokens: int = 0, output_tokens: int = 0, ttft: float | None = None,
               tpot: float | None = None, finish_reason: str | None = None, status: int = 200,
               error: BaseException | str | None = None) -> None:
        """The outcome. Times in seconds; status is the HTTP status code returned."""
        self.finished = True
        self.input_tokens, self.output_tokens = int(input_tokens), int(output_tokens)
        self.ttft, self.tpot, self.finish_reason, self.status = ttft, tpot, finish_reason, int(status)
        span = self._span
        if span is None:
            return
        span.set_attribute(n.INPUT_TOKENS, self.input_tokens)
        span.set_attribute(n.OUTPUT_TOKENS, self.output_tokens)
        if ttft is not None:
            span.set_attribute(n.TTFT, float(ttft))
        if tpot is not None:
            span.set_attribute(n.TPOT, float(tpot))
        if finish_reason:
            span.set_attribute(n.FINISH_REASONS, [finish_reason])
        span.set_attribute(n.STATUS_CODE, self.status)
        failed = self.status >= 400 or finish_reason == "error" or error is not None
        span.set_attribute(n.STATUS, "error" if failed else "ok")
        if error is not None:
            span.set_attribute(n.ERROR_TYPE, type(error).__name__ if isinstance(error, BaseException)
                               else str(error))
        if self.status >= 500 or finish_reason == "error":
            span.set_status(Status(StatusCode.ERROR, str(error) if error else None))

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and not self.finished:
            if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
                self.finish(input_tokens=self.input_tokens, output_tokens=self.output_tokens,
                            ttft=self.ttft, tpot=self.tpot, finish_reason="abort", status=499)
            else:
                self.finish(input_tokens=self.input_tokens, output_tokens=self.output_tokens,
                            ttft=self.ttft, tpot=self.tpot, finish_reason="error",
                            status=int(getattr(exc, "status", 500)), error=exc)
        if self._span is None or self.owner is None:
            return
        if exc is not None and not isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            self._span.record_exception(exc)
        if not self.finished:
            self._span.set_attribute(n.STATUS_CODE, self.status)
            self._span.set_attribute(n.STATUS, "ok")
        duration = time.perf_counter() - self._t0
        self._span.end()
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
        self.owner._record(self, duration)
