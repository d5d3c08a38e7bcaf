"""Offline telemetry: OpenTelemetry traces, metrics and logs written as OTLP/JSON lines to
rotating local files, summarised and shipped later by `ortserve telemetry`.

Importing this package (or telemetry.metrics) needs no OpenTelemetry package; the SDK is
imported only when telemetry is switched on (`Telemetry.from_settings`).
"""

from ortserve.telemetry.asgi import TelemetryMiddleware, span_of
from ortserve.telemetry.base import RequestSpan, Telemetry, TelemetryConfig
from ortserve.telemetry.files import Limits

__all__ = ["Limits", "RequestSpan", "Telemetry", "TelemetryConfig", "TelemetryMiddleware", "span_of"]
