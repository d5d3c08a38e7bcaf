"""Reading OTLP/JSON back (the inverse of otlp_json.any_value); needs no OpenTelemetry package,
so `ortserve telemetry summary|ship` run on a machine without the SDK."""

from __future__ import annotations

import base64
from typing import Any

Json = dict[str, Any]


def value_of(v: Json) -> Any:
    """The Python value of an OTLP/JSON AnyValue (inverse of any_value)."""
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [value_of(x) for x in v["arrayValue"].get("values", [])]
    if "kvlistValue" in v:
        return attrs_of(v["kvlistValue"].get("values", []))
    if "bytesValue" in v:
        return base64.b64decode(v["bytesValue"])
    return None


def attrs_of(kvs: list[Json]) -> dict[str, Any]:
    return {kv["key"]: value_of(kv.get("value", {})) for kv in kvs}
