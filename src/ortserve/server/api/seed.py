"""The seed's API: /healthz, /v1/chat, /v1/chat/stream, plus /metrics."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ortserve.engine import RequestHandle
from ortserve.engine.tokenizer import TEMPLATE_HEADER
from ortserve.models.sampling import defaults_for
from ortserve.providers.structured import constrain, response_constraint
from ortserve.server.protocol import SeedChatRequest
from ortserve.server.service import collect
from ortserve.server.sse import SSE_HEADERS, EventStream, sse, unless_disconnected
from ortserve.server.state import ServerState, state_of
from ortserve.telemetry import span_of

router = APIRouter()


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    st = state_of(request)
    engine = st.engine
    problem = engine.health() if engine is not None else None
    body: dict[str, Any] = {
        "status": "ok" if engine and not st.draining and not problem else
        ("draining" if st.draining else ("unavailable" if problem else ("error" if st.load_error else "loading"))),
        "backend": "onnx-genai",
        "device": engine.device if engine else st.settings.device,
        "model_dir": str(engine.model.dir) if engine else st.model_dir,
        "uptime": round(time.time() - st.started, 3),
    }
    if engine is not None:
        choice = engine.model.choice
        body.update(model=engine.model_id, execution_provider=choice.provider, device_reason=choice.reason,
                    context_length=engine.context_length, running=engine.stats().running,
                    waiting=engine.stats().waiting, restarts=engine.watchdog.restarts)
        if problem:
            body["reason"] = problem
    if st.load_error:
        body["error"] = st.load_error
    return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(state_of(request).metrics.render(), media_type="text/plain; version=0.0.4")


async def _submit(body: SeedChatRequest, request: Request,
                  streaming: bool) -> tuple[ServerState, Any, RequestHandle, dict[str, str]]:
    """Validate, queue, and label the request's telemetry span: what both seed routes do first."""
    body.check_stream(streaming)
    st = state_of(request)
    engine = await st.engine_for(body.model, body.keep_alive)
    defaults = defaults_for(st.settings, engine.model.dir)
    params = body.to_sampling_params(st.settings.default_max_tokens, st.settings.max_tokens_cap, defaults=defaults)
    params = constrain(engine, params, response_constraint(body.response_format))
    span = span_of(request)
    span.set(model=engine.model_id, provider="local", execution_provider=engine.model.choice.device)
    handle = engine.submit(messages=body.plain_messages(), params=params)
    headers = body.sampling_headers(params, defaults)
    if engine.codec.template_source != "model":   # no chat template: ChatML, said so (engine/tokenizer.py)
        headers[TEMPLATE_HEADER] = engine.codec.template_source
    return st, span, handle, headers


@router.post("/v1/chat")
async def chat(body: SeedChatRequest, request: Request, response: Response) -> dict[str, Any]:
    st, span, handle, headers = await _submit(body, request, streaming=False)
    response.headers.update(headers)
    answer = await unless_disconnected(request, collect(handle))
    st.record(span, answer.metrics, answer.finish_reason)
    return {"content": answer.text, "finish_reason": answer.finish_reason, "metrics": answer.metrics.to_dict()}


@router.post("/v1/chat/stream")
async def chat_stream(body: SeedChatRequest, request: Request) -> EventStream:
    st, span, handle, headers = await _submit(body, request, streaming=True)

    async def events() -> AsyncIterator[str]:
        async for ev in handle:
            if ev.finish_reason == "error":
                yield sse({"error": ev.error, "code": ev.error_code, "done": True})
                return
            if ev.text:
                yield sse({"token": ev.text})
            if ev.finished:
                st.record(span, ev.metrics, ev.finish_reason)
                yield sse({"done": True, "token": "[DONE]", "finish_reason": ev.finish_reason,
                           "metrics": ev.metrics.to_dict() if ev.metrics else None})

    return EventStream(events(), media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
