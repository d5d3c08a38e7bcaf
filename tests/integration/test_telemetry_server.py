"""End to end: requests through the real server under uvicorn, then parse the telemetry files.

Needs the server to wire telemetry (create_app sets `state.telemetry` from settings and adds
TelemetryMiddleware; routes call `span_of(request).set(...)` / `.add_result(...)`). Until it
does, the test skips with that reason rather than pass vacuously.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from servers import wait_healthy

from ortserve.config import load_settings
from ortserve.telemetry import names as n
from ortserve.telemetry.decode import attrs_of
from ortserve.telemetry.summary import iter_requests, summarize

PROMPT = "TOPSECRET-PROMPT-19"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _records(directory: Path, signal: str, key: str, inner: str, items: str) -> list[dict[str, Any]]:
    return [it for p in sorted(directory.glob(f"{signal}-*.jsonl")) for raw in p.read_text(encoding="utf-8").splitlines()
            for r in json.loads(raw)[key] for s in r[inner] for it in s[items]]


@contextlib.contextmanager
def _running(settings: Any, model_dir: Path) -> Iterator[tuple[str, Any]]:
    from ortserve.server.app import create_app

    app = create_app(settings, model_dir=model_dir, model_id="tiny")
    state = app.state.ortserve
    if state.telemetry is None or not state.telemetry.enabled:
        pytest.skip("create_app does not wire telemetry yet (state.telemetry stays None)")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{settings.port}"
    try:
        if not wait_healthy(base, 120):
            pytest.fail("server did not become healthy")
        yield base, state
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Any]]:
    home = tmp_path_factory.mktemp("home")
    settings = load_settings(home=home, telemetry=True, telemetry_dir=home / "tel", port=_port(),
                             default_max_tokens=8)
    with _running(settings, tiny_model) as (base, state):
        yield base, settings.telemetry_path, state


@pytest.fixture(scope="module")
def after_traffic(served: tuple[str, Path, Any]) -> tuple[Path, dict[str, int]]:
    base, directory, state = served
    chat = {"model": "tiny", "max_tokens": 6, "temperature": 0,
            "messages": [{"role": "user", "content": PROMPT}]}
    with httpx.Client(base_url=base, timeout=60) as c:
        assert c.post("/v1/chat/completions", json=chat).status_code == 200
        assert c.post("/v1/chat/completions", json=chat).status_code == 200
        with c.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as r:
            assert r.status_code == 200
            assert "[DONE]" in "".join(r.iter_text())
        assert c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5}).status_code == 200
        assert c.post("/v1/chat/completions", json={**chat, "model": "no-such-model"}).status_code == 404
        seed = {"messages": chat["messages"], "max_tokens": 4}
        assert c.post("/v1/chat", json=seed).status_code == 200
        with c.stream("POST", "/v1/chat/stream", json=seed) as r:
            assert "[DONE]" in "".join(r.iter_text())
        # The client can read [DONE] before the server has finished the response and ended
        # its span; the next request on the same keep-alive connection starts only after that.
        assert c.get("/healthz").status_code == 200
    sent = {"/v1/chat/completions": 4, "/v1/completions": 1, "/v1/chat": 1, "/v1/chat/stream": 1}
    # A streamed response's span ends when the server's side of the stream closes, which can
    # come a moment after the client read [DONE]: flush until every request's span is written.
    deadline = time.monotonic() + 120  # a safety net only: the loop ends when every span is written
    while True:
        state.telemetry.force_flush()
        spans = _records(directory, "traces", "resourceSpans", "scopeSpans", "spans")
        routes = [attrs_of(sp["attributes"]).get(n.ROUTE, "") for sp in spans]
        if all(routes.count(r) >= k for r, k in sent.items()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return directory, sent


def test_spans_carry_the_request_attributes(after_traffic: tuple[Path, dict[str, int]]) -> None:
    directory, sent = after_traffic
    spans = _records(directory, "traces", "resourceSpans", "scopeSpans", "spans")
    by_route: dict[str, list[dict[str, Any]]] = {}
    for sp in spans:
        a = attrs_of(sp["attributes"])
        by_route.setdefault(a.get(n.ROUTE, ""), []).append(a)
    assert {r: len(v) for r, v in by_route.items() if r in sent} == sent
    ok = [a for route in sent for a in by_route[route] if a[n.STATUS_CODE] == 200]
    assert len(ok) == sum(sent.values()) - 1
    for a in ok:
        assert a[n.MODEL] == "tiny"
        assert a[n.PROVIDER] == "local"
        assert a[n.EXECUTION_PROVIDER] in ("cpu", "CPUExecutionProvider")
        assert a[n.INPUT_TOKENS] > 0 and 0 < a[n.OUTPUT_TOKENS] <= 6
        assert a[n.TTFT] > 0
        assert n.TPOT in a or a[n.OUTPUT_TOKENS] == 1
        assert a[n.FINISH_REASONS][0] in ("stop", "length")
        assert a[n.STATUS] == "ok"
    (missing,) = [a for a in by_route["/v1/chat/completions"] if a[n.STATUS_CODE] == 404]
    assert missing[n.STATUS] == "error"


def test_metrics_logs_and_privacy(after_traffic: tuple[Path, dict[str, int]]) -> None:
    directory, _ = after_traffic
    metric_names = {m["name"] for m in _records(directory, "metrics", "resourceMetrics", "scopeMetrics",
                                                  "metrics")}
    assert {n.M_REQUESTS, n.M_DURATION, n.M_TTFT, n.M_RUNNING, n.M_WAITING} <= metric_names
    trace_ids = {sp["traceId"] for sp in _records(directory, "traces", "resourceSpans", "scopeSpans", "spans")}
    logs = _records(directory, "logs", "resourceLogs", "scopeLogs", "logRecords")
    correlated = [lr for lr in logs if lr.get("traceId")]
    assert all(lr["traceId"] in trace_ids for lr in correlated)
    access = {lr["traceId"] for lr in logs if lr.get("eventName") == "ortserve.request"}
    assert access == trace_ids  # every request has its log record, in its trace
    text = "".join(p.read_text(encoding="utf-8") for p in directory.glob("*.jsonl"))
    assert PROMPT not in text


def test_summary_counts_the_traffic(after_traffic: tuple[Path, dict[str, int]]) -> None:
    directory, sent = after_traffic
    rows = {(r.route, r.model): r for r in summarize(iter_requests(directory))}
    chat = [r for (route, _), r in rows.items() if route == "/v1/chat/completions"]
    assert sum(r.requests for r in chat) == sent["/v1/chat/completions"]
    assert sum(r.errors for r in chat) == 1


def test_unwritable_telemetry_dir_does_not_fail_requests(tiny_model: Path, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the telemetry directory should be", encoding="utf-8")
    settings = load_settings(home=tmp_path / "home", telemetry=True, telemetry_dir=blocker / "tel",
                             port=_port(), default_max_tokens=4)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    with (caplog.at_level(logging.WARNING, logger="ortserve.telemetry"),
          _running(settings, tiny_model) as (base, state),
          httpx.Client(base_url=base, timeout=60) as c):
        for _ in range(5):
            assert c.post("/v1/chat/completions", json=chat).status_code == 200
            state.telemetry.force_flush()
    warnings = [r for r in caplog.records if r.name == "ortserve.telemetry"]
    assert len(warnings) == 1 and "serving continues" in warnings[0].getMessage()
