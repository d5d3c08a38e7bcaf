"""The OpenTelemetry SDK side of telemetry: providers, processors and file exporters.

All exporting happens on SDK background threads (BatchSpanProcessor, BatchLogRecordProcessor,
PeriodicExportingMetricReader) writing OTLP/JSON lines to rotating files (files.py), so the
request path only appends to in-memory queues.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
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
from ortserve.telemetry.files import Health, RotatingWriter
from ortserve.telemetry.logs import TraceContextFilter, TraceLogHandler
from ortserve.telemetry.span import RequestSpan, StatsFn, TelemetryBase, TelemetryConfig

log = logging.getLogger("ortserve.telemetry")

__all__ = ["FileTelemetry", "RequestSpan", "TelemetryConfig"]


class FileTelemetry(TelemetryBase):
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
            max_export_batch_size=min(512, config.max_queue),
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
            max_export_batch_size=min(512, config.max_queue),
            schedule_delay_millis=config.span_delay_s * 1000))
        self.log_handler = TraceLogHandler(self.logger_provider)
        self._access_logger = self.logger_provider.get_logger("ortserve.access", __version__)
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
        the current trace/span ids, and give the handlers already on it `record.trace_id` /
        `record.span_id` (hex or "") for their formatters."""
        target = logger or logging.getLogger()
        self.log_handler.setLevel(level)
        if self.log_handler in target.handlers:
            return
        # Handler filters (unlike logger filters) also see records propagated from child loggers.
        for handler in target.handlers:
            handler.addFilter(self.log_filter)
        target.addHandler(self.log_handler)
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
            for handler in target.handlers:
                handler.removeFilter(self.log_filter)
        self.tracer_provider.shutdown()
        self.logger_provider.shutdown()
        self.meter_provider.shutdown()

    def _access_record(self, span: RequestSpan, duration: float) -> None:
        """One log record per request, in the request's trace (emitted while its span is current),
        so log-only tools see every request too. Never contains prompt or completion text."""
        failed = span.status >= 400 or span.finish_reason == "error"
        attrs = {k: v for k, v in span.attrs.items() if v is not None and k not in (n.PROMPT, n.COMPLETION)}
        attrs.update({n.STATUS_CODE: span.status, n.INPUT_TOKENS: span.input_tokens,
                      n.OUTPUT_TOKENS: span.output_tokens, "ortserve.duration_s": round(duration, 6)})
        if span.finish_reason:
            attrs[n.FINISH_REASON] = span.finish_reason
        self._access_logger.emit(
            timestamp=time.time_ns(), context=trace.set_span_in_context(span.otel_span),
            severity_number=SeverityNumber.WARN if failed else SeverityNumber.INFO,
            severity_text="WARN" if failed else "INFO", event_name="ortserve.request",
            body=f"{span.route} {span.status} {1000 * duration:.0f} ms", attributes=attrs)

    # -- RequestSpan hooks

    def _begin(self, span: RequestSpan) -> None:
        attrs = {k: v for k, v in span.attrs.items() if v is not None}
        span.otel_span = self.tracer.start_span(span.route, kind=SpanKind.SERVER, attributes=attrs)
        span.context_token = otel_context.attach(trace.set_span_in_context(span.otel_span))

    def _mark_error(self, span: RequestSpan, message: str | None) -> None:
        span.otel_span.set_status(Status(StatusCode.ERROR, message))

    def _end(self, span: RequestSpan, exc: BaseException | None, duration: float) -> None:
        if exc is not None:
            span.otel_span.record_exception(exc)
        if self.config.access_log:
            self._access_record(span, duration)
        span.otel_span.end()
        if span.context_token is not None:
            otel_context.detach(span.context_token)
            span.context_token = None
        self._record(span, duration)
