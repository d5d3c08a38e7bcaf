"""Offline telemetry: OpenTelemetry traces, metrics and logs written as OTLP/JSON lines to
rotating local files, summarised and shipped later by `ortserve telemetry`."""

from ortserve.telemetry.files import Limits
from ortserve.telemetry.otel import FileTelemetry, RequestSpan, Telemetry, TelemetryConfig

__all__ = ["FileTelemetry", "Limits", "RequestSpan", "Telemetry", "TelemetryConfig"]
