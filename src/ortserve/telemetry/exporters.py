"""OpenTelemetry SDK exporters that append OTLP/JSON lines to rotating files.

One export call = one ExportXServiceRequest = one line, so every line can be POSTed as is
to an OTLP/HTTP collector (`ortserve telemetry ship`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ortserve.telemetry.files import RotatingWriter
from ortserve.telemetry.otlp_json import encode_logs, encode_metrics, encode_spans


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class FileSpanExporter(SpanExporter):
    def __init__(self, writer: RotatingWriter) -> None:
        self.writer = writer

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        ok = self.writer.write_line(dumps(encode_spans(spans)))
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.writer.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class FileMetricExporter(MetricExporter):
    def __init__(self, writer: RotatingWriter) -> None:
        super().__init__()
        self.writer = writer

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        if not any(m.data.data_points for rm in metrics_data.resource_metrics
                   for sm in rm.scope_metrics for m in sm.metrics):
            return MetricExportResult.SUCCESS
        ok = self.writer.write_line(dumps(encode_metrics(metrics_data)))
        return MetricExportResult.SUCCESS if ok else MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.writer.close()


class FileLogExporter(LogRecordExporter):
    def __init__(self, writer: RotatingWriter) -> None:
        self.writer = writer

    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        if not batch:
            return LogRecordExportResult.SUCCESS
        ok = self.writer.write_line(dumps(encode_logs(batch)))
        return LogRecordExportResult.SUCCESS if ok else LogRecordExportResult.FAILURE

    def shutdown(self) -> None:
        self.writer.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
