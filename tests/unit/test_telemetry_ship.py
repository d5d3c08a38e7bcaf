"""`ortserve telemetry ship`: every stored record reaches an OTLP/HTTP collector exactly once.

The collector is a real HTTP server on 127.0.0.1 in a thread, recording what it receives.
"""

from __future__ import annotations

import gzip
import json
import logging
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ortserve.cli.telemetry import telemetry_group
from ortserve.errors import InvalidRequest, OfflineError
from ortserve.telemetry import TelemetryConfig
from ortserve.telemetry.files import list_files, read_complete_lines
from ortserve.telemetry.otel import FileTelemetry
from ortserve.telemetry.ship import STATE_FILE, ShipError, base_url, ship


class Collector:
    def __init__(self) -> None:
        self.received: list[tuple[str, str, dict[str, Any]]] = []
        self.fail_after: int | None = None
        self.gzipped = 0  # answer 503 once this many POSTs were accepted
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                    outer.gzipped += 1
                if outer.fail_after is not None and len(outer.received) >= outer.fail_after:
                    self.send_response(503)
                    self.end_headers()
                    self.wfile.write(b"collector overloaded")
                    return
                outer.received.append((self.path, self.headers["Content-Type"], json.loads(body)))
                reply = b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def span_ids(self) -> list[str]:
        return [sp["spanId"] for path, _, body in self.received if path == "/v1/traces"
                for rs in body["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]]

    def log_bodies(self) -> list[str]:
        return [lr["body"]["stringValue"] for path, _, body in self.received if path == "/v1/logs"
                for rl in body["resourceLogs"] for sl in rl["scopeLogs"] for lr in sl["logRecords"]]

    def metric_lines(self) -> int:
        return sum(len(body["resourceMetrics"]) for path, _, body in self.received if path == "/v1/metrics")


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


def record(directory: Path, n: int, tag: str) -> None:
    """A server session: n request spans each with a log line, and its metrics."""
    tel = FileTelemetry(TelemetryConfig(directory=directory, metric_interval_s=3600))
    logger = logging.getLogger(f"ortserve.test_ship.{tag}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    tel.install_logging(logger)
    for i in range(n):
        with tel.request_span("/v1/chat/completions", model="m") as span:
            logger.info("%s request %d", tag, i)
            span.finish(input_tokens=3, output_tokens=4, ttft=0.01, finish_reason="stop")
            tel.force_flush()  # several lines per file, like a long-running server
    tel.shutdown()


def stored_span_ids(directory: Path) -> list[str]:
    return [sp["spanId"] for f in list_files(directory, "traces") for _, raw in read_complete_lines(f.path)
            for rs in json.loads(raw)["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]]


def stored_log_bodies(directory: Path) -> list[str]:
    return [lr["body"]["stringValue"] for f in list_files(directory, "logs")
            for _, raw in read_complete_lines(f.path) for rl in json.loads(raw)["resourceLogs"]
            for sl in rl["scopeLogs"] for lr in sl["logRecords"]]


def stored_lines(directory: Path, signal: str) -> int:
    return sum(1 for f in list_files(directory, signal) for _ in read_complete_lines(f.path))


def test_ship_delivers_everything_exactly_once(tmp_path: Path, collector: Collector) -> None:
    record(tmp_path, 12, "first")
    result = ship(tmp_path, collector.url)

    stored = stored_span_ids(tmp_path)
    assert len(stored) == 12
    assert sorted(collector.span_ids()) == sorted(stored)
    assert sorted(collector.log_bodies()) == sorted(stored_log_bodies(tmp_path))
    assert {f"first request {i}" for i in range(12)} <= set(collector.log_bodies())
    assert len(stored_log_bodies(tmp_path)) == 24  # 12 app lines + 12 per-request access records
    assert collector.metric_lines() == stored_lines(tmp_path, "metrics") >= 1
    assert {path for path, _, _ in collector.received} == {"/v1/traces", "/v1/metrics", "/v1/logs"}
    assert {ctype for _, ctype, _ in collector.received} == {"application/json"}
    assert result.items["traces"] == 12 and result.items["logs"] == 24
    assert result.total == sum(stored_lines(tmp_path, s) for s in ("traces", "metrics", "logs"))

    posts = len(collector.received)
    again = ship(tmp_path, collector.url)
    assert again.total == 0 and len(collector.received) == posts  # nothing new, nothing sent

    record(tmp_path, 5, "second")  # the server ran again
    ship(tmp_path, collector.url)
    assert Counter(collector.span_ids()) == Counter(stored_span_ids(tmp_path))
    assert max(Counter(collector.span_ids()).values()) == 1
    assert Counter(collector.log_bodies()) == Counter(stored_log_bodies(tmp_path))
    assert len(collector.log_bodies()) == 2 * 17


def test_small_batches_still_exactly_once(tmp_path: Path, collector: Collector) -> None:
    record(tmp_path, 10, "x")
    result = ship(tmp_path, collector.url, max_batch_bytes=1)  # one POST per stored line
    assert result.posts["traces"] == stored_lines(tmp_path, "traces") > 1
    assert sorted(collector.span_ids()) == sorted(stored_span_ids(tmp_path))


def test_offline_collector_gives_a_clear_error_and_loses_nothing(tmp_path: Path,
                                                                 collector: Collector) -> None:
    record(tmp_path, 4, "off")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(OfflineError) as exc:
        ship(tmp_path, dead, timeout_s=2)
    assert "cannot reach the OTLP collector" in exc.value.message

    res = CliRunner().invoke(telemetry_group, ["ship", "--endpoint", dead, "--telemetry-dir", str(tmp_path)])
    assert res.exit_code == 1
    assert "cannot reach the OTLP collector" in res.output and "run `ortserve telemetry ship` again" in res.output

    res = CliRunner().invoke(telemetry_group, ["ship", "--endpoint", collector.url, "--telemetry-dir",
                                               str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "Shipped 4 spans" in res.output and "8 log records" in res.output
    assert sorted(collector.span_ids()) == sorted(stored_span_ids(tmp_path))
    res = CliRunner().invoke(telemetry_group, ["ship", "--endpoint", collector.url, "--telemetry-dir",
                                               str(tmp_path)])
    assert "Nothing new to ship" in res.output


def test_collector_failure_midway_resumes_without_duplicates(tmp_path: Path, collector: Collector) -> None:
    record(tmp_path, 8, "mid")
    collector.fail_after = 3
    with pytest.raises(ShipError, match="503"):
        ship(tmp_path, collector.url, max_batch_bytes=1)
    assert len(collector.received) == 3
    assert json.loads((tmp_path / STATE_FILE).read_text(encoding="utf-8"))["files"]  # progress was kept
    collector.fail_after = None
    ship(tmp_path, collector.url, max_batch_bytes=1)
    assert Counter(collector.span_ids()) == Counter(stored_span_ids(tmp_path))
    assert Counter(collector.log_bodies()) == Counter(stored_log_bodies(tmp_path))
    assert {f"mid request {i}" for i in range(8)} <= set(collector.log_bodies())


def test_dry_run_and_status(tmp_path: Path, collector: Collector) -> None:
    record(tmp_path, 3, "dry")
    runner = CliRunner()
    res = runner.invoke(telemetry_group, ["ship", "--dry-run", "--endpoint", collector.url,
                                          "--telemetry-dir", str(tmp_path)])
    assert f"{stored_lines(tmp_path, 'traces')} traces lines" in res.output
    assert collector.received == []
    res = runner.invoke(telemetry_group, ["status", "--telemetry-dir", str(tmp_path)])
    assert res.exit_code == 0 and "not shipped" in res.output


def test_endpoint_forms() -> None:
    assert base_url("http://c:4318/") == "http://c:4318"
    assert base_url("http://c:4318/v1/traces") == "http://c:4318"
    assert base_url("https://c/otlp") == "https://c/otlp"
    with pytest.raises(InvalidRequest):
        base_url("c:4318")


def test_gzip_bodies(tmp_path: Path, collector: Collector) -> None:
    record(tmp_path, 3, "gz")
    res = CliRunner().invoke(telemetry_group, ["ship", "--gzip", "--endpoint", collector.url,
                                               "--telemetry-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert collector.gzipped == len(collector.received) == 3  # traces, metrics, logs
    assert sorted(collector.span_ids()) == sorted(stored_span_ids(tmp_path))
