"""TelemetryMiddleware + span_of on a small FastAPI app (no model): the wiring the server uses."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ortserve.errors import OrtServeError, Overloaded
from ortserve.telemetry import Telemetry, TelemetryConfig, TelemetryMiddleware, span_of
from ortserve.telemetry import names as n
from ortserve.telemetry.decode import attrs_of
from ortserve.telemetry.otel import FileTelemetry
from ortserve.types import Metrics

log = logging.getLogger("ortserve.test_asgi_app")


def make_app(tel: Telemetry) -> FastAPI:
    app = FastAPI()

    @app.exception_handler(OrtServeError)
    async def _err(_: Request, err: OrtServeError) -> JSONResponse:
        return JSONResponse(err.to_openai(), status_code=err.status)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        span = span_of(request)
        span.set(model="tiny", provider="local", execution_provider="cpu")
        span.record_content(prompt=body["messages"])
        log.info("generating")
        for out, ttft, reason in ((4, 0.02, "stop"), (6, 0.01, "length")):  # n = 2
            span.add_result(Metrics(model="tiny", input_tokens=9, output_tokens=out, ttft=ttft, tpot=0.005),
                            reason)
        return {"ok": True}

    @app.post("/v1/completions")
    async def stream(request: Request) -> StreamingResponse:
        span = span_of(request)
        span.set(model="tiny", provider="local")

        async def chunks() -> AsyncIterator[str]:
            for i in range(3):
                await asyncio.sleep(0.01)
                log.info("chunk %d", i)
                yield f"data: {i}\n\n"
            span.add_result(Metrics(model="tiny", input_tokens=2, output_tokens=3, ttft=0.01), "stop")

        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.post("/v1/busy")
    async def busy() -> None:
        raise Overloaded("queue full")

    return app


def spans_by_route(directory: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for path in directory.glob("traces-*.jsonl"):
        for raw in path.read_text(encoding="utf-8").splitlines():
            for rs in json.loads(raw)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        out[sp["name"]] = sp
    return out


@pytest.fixture
def logger_to() -> logging.Logger:
    log.setLevel(logging.INFO)
    log.propagate = False
    return log


def test_middleware_records_each_request(tmp_path: Path, logger_to: logging.Logger) -> None:
    tel = FileTelemetry(TelemetryConfig(directory=tmp_path, metric_interval_s=3600))
    tel.install_logging(logger_to)
    app = make_app(tel)
    app.add_middleware(TelemetryMiddleware, telemetry=tel)

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "PRIVATE"}]})
            assert r.status_code == 200
            r = await c.post("/v1/completions", json={})
            assert r.text.count("data:") == 3
            assert (await c.post("/v1/busy")).status_code == 429

    asyncio.run(run())
    tel.shutdown()

    spans = spans_by_route(tmp_path)
    chat = attrs_of(spans["/v1/chat/completions"]["attributes"])
    assert chat[n.MODEL] == "tiny" and chat[n.PROVIDER] == "local" and chat[n.EXECUTION_PROVIDER] == "cpu"
    assert chat[n.INPUT_TOKENS] == 9 and chat[n.OUTPUT_TOKENS] == 10
    assert chat[n.TTFT] == pytest.approx(0.01) and chat[n.TPOT] == pytest.approx(0.005)
    assert chat[n.FINISH_REASONS] == ["length"] and chat[n.STATUS_CODE] == 200
    assert chat["http.request.method"] == "POST"
    streamed = attrs_of(spans["/v1/completions"]["attributes"])
    assert streamed[n.OUTPUT_TOKENS] == 3 and streamed[n.STATUS] == "ok"
    busy = attrs_of(spans["/v1/busy"]["attributes"])
    assert busy[n.STATUS_CODE] == 429 and busy[n.STATUS] == "error"

    logs = [lr for p in tmp_path.glob("logs-*.jsonl") for raw in p.read_text(encoding="utf-8").splitlines()
            for rl in json.loads(raw)["resourceLogs"] for sl in rl["scopeLogs"] for lr in sl["logRecords"]]
    by_body = {lr["body"]["stringValue"]: lr for lr in logs}
    assert by_body["generating"]["traceId"] == spans["/v1/chat/completions"]["traceId"]
    for i in range(3):  # lines logged while the stream body runs belong to that request
        assert by_body[f"chunk {i}"]["traceId"] == spans["/v1/completions"]["traceId"]
    assert "PRIVATE" not in "".join(p.read_text(encoding="utf-8") for p in tmp_path.glob("*.jsonl"))


def test_span_of_without_middleware_is_a_noop() -> None:
    app = make_app(Telemetry())
    app.add_middleware(TelemetryMiddleware, telemetry=Telemetry())

    async def run() -> int:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            r = await c.post("/v1/chat/completions", json={"messages": []})
            return r.status_code

    assert asyncio.run(run()) == 200
