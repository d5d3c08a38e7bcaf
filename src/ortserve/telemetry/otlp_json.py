"""OTLP/JSON encoding of SDK spans, metrics and log records.

Each function returns one ExportTraceServiceRequest / ExportMetricsServiceRequest /
ExportLogsServiceRequest as a plain dict, following the OTLP/JSON rules: lowerCamelCase
field names, trace and span ids as lowercase hex (not base64), enums as integers and
64-bit integers as decimal strings. Written by hand so the file exporters need nothing
beyond opentelemetry-sdk (no protobuf).
"""

from __future__ import annotations

import base64
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import (
    ExponentialHistogram,
    Gauge,
    Histogram,
    MetricsData,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

Json = dict[str, Any]


def any_value(value: Any) -> Json:
    """An OTLP AnyValue."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value} if math.isfinite(value) else {"stringValue": str(value)}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, (bytes, bytearray)):
        return {"bytesValue": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": attributes(value)}}
    if isinstance(value, Sequence):
        return {"arrayValue": {"values": [any_value(v) for v in value]}}
    if value is None:
        return {}
    return {"stringValue": str(value)}


def attributes(attrs: Mapping[str, Any] | None) -> list[Json]:
    return [{"key": str(k), "value": any_value(v)} for k, v in (attrs or {}).items()]


def resource(res: Resource | None) -> Json:
    return {"attributes": attributes(res.attributes if res else None), "droppedAttributesCount": 0}


def scope(sc: InstrumentationScope | None) -> Json:
    if sc is None:
        return {"name": ""}
    out: Json = {"name": sc.name}
    if sc.version:
        out["version"] = sc.version
    if sc.attributes:
        out["attributes"] = attributes(sc.attributes)
    return out


def trace_id_hex(trace_id: int) -> str:
    return f"{trace_id:032x}"


def span_id_hex(span_id: int) -> str:
    return f"{span_id:016x}"


# ---------------------------------------------------------------- traces

def _span(span: ReadableSpan) -> Json:
    ctx = span.get_span_context()
    assert ctx is not None  # SDK spans always have one
    out: Json = {
        "traceId": trace_id_hex(ctx.trace_id),
        "spanId": span_id_hex(ctx.span_id),
        "flags": int(ctx.trace_flags),
        "name": span.name,
        # SDK SpanKind starts at INTERNAL=0; OTLP reserves 0 for UNSPECIFIED.
        "kind": span.kind.value + 1,
        "startTimeUnixNano": str(span.start_time or 0),
        "endTimeUnixNano": str(span.end_time or 0),
        "attributes": attributes(span.attributes),
        "droppedAttributesCount": span.dropped_attributes,
        "events": [{"timeUnixNano": str(e.timestamp), "name": e.name,
                    "attributes": attributes(e.attributes)} for e in span.events],
        "droppedEventsCount": span.dropped_events,
        "links": [{"traceId": trace_id_hex(link.context.trace_id),
                   "spanId": span_id_hex(link.context.span_id),
                   "attributes": attributes(link.attributes)} for link in span.links],
        "droppedLinksCount": span.dropped_links,
        "status": {"code": span.status.status_code.value,
                   **({"message": span.status.description} if span.status.description else {})},
    }
    if ctx.trace_state:
        out["traceState"] = ctx.trace_state.to_header()
    if span.parent is not None:
        out["parentSpanId"] = span_id_hex(span.parent.span_id)
    return out


def encode_spans(spans: Iterable[ReadableSpan]) -> Json:
    """ExportTraceServiceRequest for a batch of finished spans."""
    grouped: dict[Resource, dict[InstrumentationScope | None, list[Json]]] = defaultdict(
        lambda: defaultdict(list))
    for span in spans:
        grouped[span.resource][span.instrumentation_scope].append(_span(span))
    return {"resourceSpans": [
        {"resource": resource(res),
         "scopeSpans": [{"scope": scope(sc), "spans": items} for sc, items in by_scope.items()]}
        for res, by_scope in grouped.items()
    ]}


# ---------------------------------------------------------------- metrics

def _number_point(p: Any) -> Json:
    out: Json = {"attributes": attributes(p.attributes),
                 "startTimeUnixNano": str(p.start_time_unix_nano or 0),
                 "timeUnixNano": str(p.time_unix_nano)}
    if isinstance(p.value, int) and not isinstance(p.value, bool):
        out["asInt"] = str(p.value)
    else:
        out["asDouble"] = float(p.value)
    return out


def _histogram_point(p: Any) -> Json:
    out: Json = {"attributes": attributes(p.attributes),
                 "startTimeUnixNano": str(p.start_time_unix_nano),
                 "timeUnixNano": str(p.time_unix_nano),
                 "count": str(p.count), "sum": float(p.sum),
                 "bucketCounts": [str(c) for c in p.bucket_counts],
                 "explicitBounds": [float(b) for b in p.explicit_bounds]}
    if p.count:
        out["min"] = float(p.min)
        out["max"] = float(p.max)
    return out


def _exp_histogram_point(p: Any) -> Json:
    def buckets(b: Any) -> Json:
        return {"offset": b.offset, "bucketCounts": [str(c) for c in b.bucket_counts]}

    out: Json = {"attributes": attributes(p.attributes),
                 "startTimeUnixNano": str(p.start_time_unix_nano),
                 "timeUnixNano": str(p.time_unix_nano),
                 "count": str(p.count), "sum": float(p.sum), "scale": p.scale,
                 "zeroCount": str(p.zero_count), "positive": buckets(p.positive),
                 "negative": buckets(p.negative), "flags": p.flags}
    if p.count:
        out["min"] = float(p.min)
        out["max"] = float(p.max)
    return out


def _metric(metric: Any) -> Json:
    out: Json = {"name": metric.name, "description": metric.description or "", "unit": metric.unit or ""}
    data = metric.data
    if isinstance(data, Sum):
        out["sum"] = {"dataPoints": [_number_point(p) for p in data.data_points],
                      "aggregationTemporality": data.aggregation_temporality.value,
                      "isMonotonic": data.is_monotonic}
    elif isinstance(data, Gauge):
        out["gauge"] = {"dataPoints": [_number_point(p) for p in data.data_points]}
    elif isinstance(data, Histogram):
        out["histogram"] = {"dataPoints": [_histogram_point(p) for p in data.data_points],
                            "aggregationTemporality": data.aggregation_temporality.value}
    elif isinstance(data, ExponentialHistogram):
        out["exponentialHistogram"] = {
            "dataPoints": [_exp_histogram_point(p) for p in data.data_points],
            "aggregationTemporality": data.aggregation_temporality.value}
    return out


def encode_metrics(data: MetricsData) -> Json:
    """ExportMetricsServiceRequest for one collection."""
    return {"resourceMetrics": [
        {"resource": resource(rm.resource),
         "scopeMetrics": [{"scope": scope(sm.scope), "metrics": [_metric(m) for m in sm.metrics],
                           **({"schemaUrl": sm.schema_url} if sm.schema_url else {})}
                          for sm in rm.scope_metrics],
         **({"schemaUrl": rm.schema_url} if rm.schema_url else {})}
        for rm in data.resource_metrics
    ]}


# ---------------------------------------------------------------- logs

def _log_record(rec: Any) -> Json:
    lr = rec.log_record
    out: Json = {
        "timeUnixNano": str(lr.timestamp or 0),
        "observedTimeUnixNano": str(lr.observed_timestamp or lr.timestamp or 0),
        "severityNumber": lr.severity_number.value if lr.severity_number is not None else 0,
        "severityText": lr.severity_text or "",
        "body": any_value(lr.body),
        "attributes": attributes(lr.attributes),
        "droppedAttributesCount": rec.dropped_attributes,
        "flags": int(lr.trace_flags or 0),
    }
    if lr.trace_id:
        out["traceId"] = trace_id_hex(lr.trace_id)
    if lr.span_id:
        out["spanId"] = span_id_hex(lr.span_id)
    if getattr(lr, "event_name", None):
        out["eventName"] = lr.event_name
    return out


def encode_logs(records: Iterable[Any]) -> Json:
    """ExportLogsServiceRequest for a batch of SDK ReadableLogRecord."""
    grouped: dict[Resource, dict[InstrumentationScope | None, list[Json]]] = defaultdict(
        lambda: defaultdict(list))
    for rec in records:
        grouped[rec.resource][rec.instrumentation_scope].append(_log_record(rec))
    return {"resourceLogs": [
        {"resource": resource(res),
         "scopeLogs": [{"scope": scope(sc), "logRecords": items} for sc, items in by_scope.items()]}
        for res, by_scope in grouped.items()
    ]}
