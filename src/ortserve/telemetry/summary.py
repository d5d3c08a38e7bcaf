"""Read request spans back from the trace files and summarise them (`ortserve telemetry summary`)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ortserve.errors import InvalidRequest
from ortserve.telemetry import names as n
from ortserve.telemetry.decode import attrs_of
from ortserve.telemetry.files import list_files, read_complete_lines

SPAN_KIND_SERVER = 2


@dataclass(frozen=True)
class RequestRecord:
    """One request span, flattened."""

    trace_id: str
    route: str
    model: str
    provider: str
    execution_provider: str
    status_code: int
    ok: bool
    finish_reason: str
    input_tokens: int
    output_tokens: int
    ttft: float | None
    tpot: float | None
    start: float      # unix seconds
    duration: float   # seconds


def iter_lines(directory: Path, signal: str, since: float | None = None) -> Iterator[dict[str, Any]]:
    """Each parsed OTLP/JSON line of one signal, oldest file first; corrupt lines are skipped."""
    for f in list_files(directory, signal):
        if since is not None and f.mtime < since:  # nothing newer than `since` in it
            continue
        for _, raw in read_complete_lines(f.path):
            try:
                yield json.loads(raw)
            except ValueError:
                continue


def iter_requests(directory: Path, since: float | None = None) -> Iterator[RequestRecord]:
    for req in iter_lines(directory, "traces", since):
        for rs in req.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                if ss.get("scope", {}).get("name") != n.SCOPE:
                    continue
                for span in ss.get("spans", []):
                    rec = _record(span)
                    if rec is not None and (since is None or rec.start >= since):
                        yield rec


def _record(span: dict[str, Any]) -> RequestRecord | None:
    a = attrs_of(span.get("attributes", []))
    if span.get("kind") != SPAN_KIND_SERVER or n.ROUTE not in a:
        return None
    start = int(span.get("startTimeUnixNano", 0))
    end = int(span.get("endTimeUnixNano", 0))
    reasons = a.get(n.FINISH_REASONS) or [""]
    status_code = int(a.get(n.STATUS_CODE, 0))
    return RequestRecord(
        trace_id=span.get("traceId", ""), route=a[n.ROUTE], model=a.get(n.MODEL, ""),
        provider=a.get(n.PROVIDER, ""), execution_provider=a.get(n.EXECUTION_PROVIDER, ""),
        status_code=status_code, ok=a.get(n.STATUS, "ok") == "ok" and status_code < 400,
        finish_reason=reasons[0], input_tokens=int(a.get(n.INPUT_TOKENS, 0)),
        output_tokens=int(a.get(n.OUTPUT_TOKENS, 0)), ttft=a.get(n.TTFT), tpot=a.get(n.TPOT),
        start=start / 1e9, duration=max(0, end - start) / 1e9)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


QUANTILES = (50, 90, 99)


@dataclass
class Row:
    route: str
    model: str
    requests: int = 0
    errors: int = 0
    client_errors: int = 0
    server_errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    ttft_ms: dict[str, float | None] = field(default_factory=dict)
    total_ms: dict[str, float | None] = field(default_factory=dict)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "error_rate": round(self.error_rate, 6)}


def summarize(records: Iterable[RequestRecord]) -> list[Row]:
    """One row per (route, model), sorted, then an "all" row when there is more than one."""
    groups: dict[tuple[str, str], list[RequestRecord]] = {}
    everything: list[RequestRecord] = []
    for r in records:
        groups.setdefault((r.route, r.model), []).append(r)
        everything.append(r)
    rows = [_row(route, model, recs) for (route, model), recs in sorted(groups.items())]
    if len(rows) > 1:
        rows.append(_row("all", "all", everything))
    return rows


def _row(route: str, model: str, recs: list[RequestRecord]) -> Row:
    ttfts = [r.ttft * 1000 for r in recs if r.ttft is not None]
    totals = [r.duration * 1000 for r in recs]
    return Row(
        route=route, model=model, requests=len(recs), errors=sum(not r.ok for r in recs),
        client_errors=sum(400 <= r.status_code < 500 for r in recs),
        server_errors=sum(r.status_code >= 500 for r in recs),
        input_tokens=sum(r.input_tokens for r in recs), output_tokens=sum(r.output_tokens for r in recs),
        ttft_ms={f"p{q}": percentile(ttfts, q) for q in QUANTILES},
        total_ms={f"p{q}": percentile(totals, q) for q in QUANTILES})


def format_table(rows: list[Row]) -> str:
    head = ["route", "model", "requests", "errors", "4xx", "5xx", "error%", "ttft p50/p90/p99 ms",
            "total p50/p90/p99 ms", "tokens in/out"]
    body = [[r.route, r.model or "-", str(r.requests), str(r.errors), str(r.client_errors),
             str(r.server_errors), f"{100 * r.error_rate:.1f}", _triple(r.ttft_ms), _triple(r.total_ms),
             f"{r.input_tokens}/{r.output_tokens}"] for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *body])


def _triple(ms: dict[str, float | None]) -> str:
    return "/".join("-" if ms[f"p{q}"] is None else f"{ms[f'p{q}']:.0f}" for q in QUANTILES)


_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now: float) -> float:
    """'30m', '2h', '7d', '1w' (ago) or an ISO date/time (UTC unless it has an offset) -> unix s."""
    m = _SPAN.match(text)
    if m:
        return now - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidRequest(f"--since {text!r}: use a duration like 30m, 2h, 7d or an ISO date "
                             "like 2025-03-07T12:00", param="since") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()
