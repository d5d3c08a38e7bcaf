"""Standard-library logging into the OpenTelemetry log pipeline, correlated with traces.

`TraceLogHandler` turns each `logging.LogRecord` into an OTel log record carrying the trace
and span id of the span current when it was logged (the request span, inside
`Telemetry.request_span`). `TraceContextFilter` puts the same ids on the stdlib record
(`record.trace_id`, `record.span_id`) so plain-text formatters can print them too.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry._logs import Logger, SeverityNumber
from opentelemetry.sdk._logs import LoggerProvider

# Our own warnings (disk full...) and the SDK's must not feed back into the pipeline.
_SKIP = ("ortserve.telemetry", "opentelemetry")
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName", "trace_id", "span_id"}


def severity(levelno: int) -> SeverityNumber:
    """stdlib level -> OTel severity (DEBUG 5, INFO 9, WARN 13, ERROR 17, FATAL 21)."""
    if levelno < logging.INFO:
        return SeverityNumber.DEBUG
    if levelno < logging.WARNING:
        return SeverityNumber.INFO
    if levelno < logging.ERROR:
        return SeverityNumber.WARN
    if levelno < logging.CRITICAL:
        return SeverityNumber.ERROR
    return SeverityNumber.FATAL


_TEXT = {"WARNING": "WARN", "CRITICAL": "FATAL"}


class TraceLogHandler(logging.Handler):
    def __init__(self, provider: LoggerProvider, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self._provider = provider
        self._loggers: dict[str, Logger] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(_SKIP):
            return
        try:
            logger = self._loggers.get(record.name)
            if logger is None:
                logger = self._loggers.setdefault(record.name, self._provider.get_logger(record.name))
            logger.emit(
                timestamp=int(record.created * 1e9),
                observed_timestamp=time.time_ns(),
                context=otel_context.get_current(),
                severity_number=severity(record.levelno),
                severity_text=_TEXT.get(record.levelname, record.levelname),
                body=record.getMessage(),
                attributes=_attributes(record),
            )
        except Exception:  # noqa: BLE001 - a broken log line must never break the caller
            self.handleError(record)


def _attributes(record: logging.LogRecord) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "log.logger": record.name,
        "code.file.path": record.pathname,
        "code.function.name": record.funcName,
        "code.line.number": record.lineno,
    }
    for key, value in vars(record).items():
        if key not in _STANDARD and isinstance(value, (str, int, float, bool)):
            attrs[key] = value
    if record.exc_info and record.exc_info[0] is not None:
        etype, evalue, _ = record.exc_info
        attrs["exception.type"] = etype.__name__
        attrs["exception.message"] = str(evalue)
        attrs["exception.stacktrace"] = "".join(traceback.format_exception(*record.exc_info))
    return attrs


class TraceContextFilter(logging.Filter):
    """Adds `trace_id` and `span_id` (hex, or "") to every record passing through."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = trace.get_current_span().get_span_context()
        record.trace_id = f"{ctx.trace_id:032x}" if ctx.is_valid else ""
        record.span_id = f"{ctx.span_id:016x}" if ctx.is_valid else ""
        return True

