"""What the server calls: `Telemetry` (a no-op when telemetry is off) and `RequestSpan`.

    tel = Telemetry.from_settings(settings)        # no-op object unless settings.telemetry
    tel.install_logging()                          # root logger -> OTel logs with trace ids
    tel.observe_engine(engine.stats, model=engine.model_id)
    with tel.request_span("/v1/chat/completions", model=m, provider="local",
                          execution_provider="cpu") as span:
        ...
        span.finish(input_tokens=12, output_tokens=30, ttft=0.05, tpot=0.01,
                    finish_reason="stop", status=200)
    tel.shutdown()                                 # flushes everything

This module imports no OpenTelemetry package, so serving with telemetry off needs none;
the SDK-backed implementation is `otel.FileTelemetry`, loaded only when switched on. Both
build on `span.TelemetryBase` (the interface, no-op), which is why otel need not import this.
"""

from __future__ import annotations

from typing import Any

from ortserve.errors import DependencyMissing
from ortserve.telemetry.span import RequestSpan, SpanOwner, StatsFn, TelemetryBase, TelemetryConfig

__all__ = ["RequestSpan", "SpanOwner", "StatsFn", "Telemetry", "TelemetryBase", "TelemetryConfig"]


class Telemetry(TelemetryBase):
    """Telemetry switched off: every method is a cheap no-op. `from_settings` returns the
    real thing (`otel.FileTelemetry`) when `settings.telemetry` is true."""

    @staticmethod
    def from_settings(settings: Any, **overrides: Any) -> TelemetryBase:
        """`overrides` are TelemetryConfig fields (limits, metric_interval_s, ...)."""
        if not getattr(settings, "telemetry", False):
            return Telemetry()
        try:
            from ortserve.telemetry.otel import FileTelemetry
        except ImportError as exc:
            raise DependencyMissing(f"telemetry is on but OpenTelemetry is missing ({exc.name})",
                                    hint="pip install 'ortserve[telemetry]' or set ORTSERVE_TELEMETRY=0") from exc
        config = TelemetryConfig(directory=settings.telemetry_path,
                                 content=bool(settings.telemetry_content), **overrides)
        return FileTelemetry(config)
