"""Send stored telemetry to an OTLP/HTTP collector (`ortserve telemetry ship`).

Every line in the files is already one OTLP/JSON Export*ServiceRequest; shipping merges
lines into batches and POSTs them to <endpoint>/v1/traces, /v1/metrics and /v1/logs with
Content-Type application/json. `.ship-state.json` in the telemetry directory records, per
file, the byte offset delivered so far; it is rewritten (atomically) after every accepted
batch, so a second run sends only what is new and a run cut off by the network resumes
where it stopped. A lock file keeps two shippers from sending the same records.

Delivery is exactly once unless the process dies between the collector accepting a batch
and the state file being replaced (a window of one local file write); then that one batch
is sent again on the next run.
"""

from __future__ import annotations

import contextlib
import gzip as gzip_module
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from ortserve.errors import InvalidRequest, OfflineError, OrtServeError
from ortserve.telemetry.files import SIGNALS, exclusive_lock, list_files, read_complete_lines

STATE_FILE = ".ship-state.json"
LOCK_FILE = ".ship.lock"
ROOT_KEY = {"traces": "resourceSpans", "metrics": "resourceMetrics", "logs": "resourceLogs"}
MAX_BATCH_BYTES = 2 * 1024 * 1024


class ShipError(OrtServeError):
    """The collector answered but refused a batch."""

    status = 502
    type = "api_error"
    code = "collector_error"


@dataclass
class ShipResult:
    records: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIGNALS, 0))  # lines
    items: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIGNALS, 0))  # spans...
    posts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SIGNALS, 0))
    bytes: int = 0
    corrupt: int = 0
    rejected: int = 0  # items the collector reported as rejected (partialSuccess)

    @property
    def total(self) -> int:
        return sum(self.records.values())


def base_url(endpoint: str) -> str:
    """`http://host:4318` (a trailing /v1/<signal> is tolerated) -> `http://host:4318`."""
    url = endpoint.strip().rstrip("/")
    for signal in SIGNALS:
        url = url.removesuffix(f"/v1/{signal}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise InvalidRequest(f"--endpoint {endpoint!r}: expected an OTLP/HTTP URL like "
                             "http://collector:4318", param="endpoint")
    return url


def count_items(signal: str, resources: list[Any]) -> int:
    """Spans, metric data points or log records in a list of resource entries."""
    total = 0
    for res in resources:
        if signal == "traces":
            total += sum(len(s.get("spans", [])) for s in res.get("scopeSpans", []))
        elif signal == "logs":
            total += sum(len(s.get("logRecords", [])) for s in res.get("scopeLogs", []))
        else:
            for sm in res.get("scopeMetrics", []):
                for m in sm.get("metrics", []):
                    for kind in ("sum", "gauge", "histogram", "exponentialHistogram", "summary"):
                        total += len(m.get(kind, {}).get("dataPoints", []))
    return total


def load_state(directory: Path) -> dict[str, Any]:
    state: dict[str, Any]
    try:
        state = json.loads((directory / STATE_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        state = {}
    except ValueError as exc:
        raise OrtServeError(f"{directory / STATE_FILE} is corrupt ({exc}); it records what was "
                            "already shipped, so fix or delete it (deleting re-sends everything)") from None
    state.setdefault("files", {})
    state.setdefault("delivered", dict.fromkeys(SIGNALS, 0))
    return state


def save_state(directory: Path, state: dict[str, Any]) -> None:
    tmp = directory / f"{STATE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
    tmp.replace(directory / STATE_FILE)


def pending(directory: Path) -> dict[str, int]:
    """Complete lines not shipped yet, per signal (for `ship --dry-run` and status)."""
    state = load_state(directory)
    counts = dict.fromkeys(SIGNALS, 0)
    for f in list_files(directory):
        counts[f.signal] += sum(1 for _ in read_complete_lines(f.path, state["files"].get(f.name, 0)))
    return counts


def ship(directory: Path, endpoint: str, *, timeout_s: float = 10.0,
         max_batch_bytes: int = MAX_BATCH_BYTES, headers: dict[str, str] | None = None,
         gzip: bool = False, client: httpx.Client | None = None) -> ShipResult:
    """POST every record not yet delivered; returns what was sent. Raises OfflineError when
    the collector cannot be reached (everything delivered before that stays remembered)."""
    url = base_url(endpoint)
    directory = Path(directory)
    if not directory.is_dir():
        return ShipResult()
    own = client is None
    http = client or httpx.Client(timeout=timeout_s)
    try:
        with exclusive_lock(directory / LOCK_FILE):
            return _Shipper(directory, url, http, headers or {}, max_batch_bytes, gzip).run()
    finally:
        if own:
            http.close()


class _Shipper:
    def __init__(self, directory: Path, url: str, http: httpx.Client, headers: dict[str, str],
                 max_batch_bytes: int, gzip: bool) -> None:
        self.directory, self.url, self.http = directory, url, http
        self.gzip = gzip
        self.headers = {"Content-Type": "application/json", **headers}
        if gzip:
            self.headers["Content-Encoding"] = "gzip"
        self.max_batch_bytes = max_batch_bytes
        self.state = load_state(directory)
        self.result = ShipResult()

    def run(self) -> ShipResult:
        files = list_files(self.directory)
        present = {f.name for f in files}
        self.state["files"] = {k: v for k, v in self.state["files"].items() if k in present}
        self.state["endpoint"] = self.url
        for signal in SIGNALS:
            self._ship_signal(signal, [f.path for f in files if f.signal == signal])
        save_state(self.directory, self.state)
        return self.result

    def _ship_signal(self, signal: str, paths: list[Path]) -> None:
        batch: list[Any] = []
        lines = size = 0
        marks: dict[str, int] = {}
        for path in paths:
            for end, raw in read_complete_lines(path, self.state["files"].get(path.name, 0)):
                marks[path.name] = end
                try:
                    batch.extend(json.loads(raw).get(ROOT_KEY[signal], []))
                except (ValueError, AttributeError):
                    self.result.corrupt += 1
                    continue
                lines += 1
                size += len(raw)
                if size >= self.max_batch_bytes:
                    self._deliver(signal, batch, marks, lines, size)
                    batch, marks, lines, size = [], {}, 0, 0
        if marks:
            self._deliver(signal, batch, marks, lines, size)

    def _deliver(self, signal: str, batch: list[Any], marks: dict[str, int], lines: int,
                 size: int) -> None:
        if batch:
            self._post(signal, {ROOT_KEY[signal]: batch})
            self.result.posts[signal] += 1
            self.result.bytes += size
            self.result.items[signal] += count_items(signal, batch)
        self.result.records[signal] += lines
        self.state["files"].update(marks)
        self.state["delivered"][signal] = self.state["delivered"].get(signal, 0) + lines
        save_state(self.directory, self.state)

    def _post(self, signal: str, body: dict[str, Any]) -> None:
        target = f"{self.url}/v1/{signal}"
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if self.gzip:
            data = gzip_module.compress(data, compresslevel=6)
        try:
            resp = self.http.post(target, content=data, headers=self.headers)
        except (httpx.TransportError, OSError) as exc:
            raise OfflineError(
                f"cannot reach the OTLP collector at {self.url} ({type(exc).__name__}: {exc})",
                hint=f"{self.result.total} records delivered before the failure are remembered; "
                     "run `ortserve telemetry ship` again when the network is up") from None
        if resp.status_code >= 300:
            raise ShipError(f"collector at {target} answered {resp.status_code}: {resp.text[:200]}",
                            hint="nothing from this batch was marked as shipped")
        with contextlib.suppress(ValueError, AttributeError):
            partial = resp.json().get("partialSuccess") or {}
            self.result.rejected += sum(int(v) for k, v in partial.items() if k.startswith("rejected"))
