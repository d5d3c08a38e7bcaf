"""The OpenAI-compatible API: /v1/chat/completions, /v1/completions, /v1/models."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ortserve.engine import RequestHandle
from ortserve.models.sampling import defaults_for
from ortserve.server.protocol import ChatCompletionRequest, CompletionRequest
from ortserve.server.routes_routed import routed_chat, wants_router
from ortserve.server.routes_seed import state_of
from ortserve.server.service import collect, engine_error, submit_n, usage
from ortserve.server.sse import SSE_HEADERS, EventStream, merge, sse, unless_disconnected
from ortserve.server.structured import (
    ToolPlan,
    chat_logprobs,
    completion_logprobs,
    constrain,
    delta_of,
    message_of,
    plan_tools,
    response_constraint,
)
from ortserve.telemetry import span_of
from ortserve.types import SamplingParams

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    """The pinned model first, then every model the store can serve, each saying if it is loaded."""
    st = state_of(request)
    engine = st.ready_engine()
    data = [{"id": engine.model_id, "object": "model", "created": int(st.started), "owned_by": "ortserve",
             "context_length": engine.context_length, "loaded": True, "pinned": True, "kind": "chat"}]
    data += store_models(st, skip={engine.model_id})
    if st.router is not None and len(st.router.providers) > 1:  # cloud providers configured
        data.append({"id": "auto", "object": "model", "created": int(st.started), "owned_by": "ortserve-router"})
    return {"object": "list", "data": data}


def store_models(st: Any, skip: set[str]) -> list[dict[str, Any]]:
    """Every store variant as an OpenAI model entry, with loaded yes/no from the manager."""
    from ortserve.models.store import ModelStore

    rows = st.manager.ps() if st.manager is not None else []
    loaded = {r["model"]: r for r in rows}
    served_dirs = {Path(r["path"]).resolve() for r in rows if r["pinned"]}
    out = []
    for v in ModelStore(st.settings.store_dir).variants():
        if v.id in skip or Path(v.model_dir).resolve() in served_dirs:
            continue  # the pinned model, listed first under the name it was started with
        row = loaded.get(v.id)
        out.append({"id": v.id, "object": "model", "created": int(v.created), "owned_by": "ortserve",
                    "context_length": v.context_length or None, "loaded": bool(row and row["state"] == "loaded"),
                    "pinned": False, "aliases": v.aliases, "kind": getattr(v, "kind", None) or "chat"})
    return out


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    if body.file_search is not None:  # answer from vector stores, with citations (server/rag_chat.py)
        from ortserve.server.rag_chat import add_to_response, apply_file_search

        cites = await apply_file_search(body, request)
        body.file_search = None
        return add_to_response(await chat_completions(body, request), cites)
    st = state_of(request)
    span = span_of(request)
    if wants_router(st, body.model, st.served_id):
        st.ready_engine()
        return await routed_chat(body, request, st, span)
    engine = await st.engine_for(body.model, body.keep_alive)
    model = engine.model_id
    span.set(model=model, provider="local", execution_provider=engine.model.choice.device)
    defaults = defaults_for(st.settings, engine.model.dir)
    params = body.to_sampling_params(st.settings.default_max_tokens, st.settings.max_tokens_cap,
                                     body.effective_max_tokens(), defaults)
    headers = body.sampling_headers(params, defaults)
    plan = plan_tools(body)
    params = constrain(engine, params, response_constraint(body.response_format), plan)
    params = replace(params, logprobs=body.logprobs_count())
    handles = submit_n(engine, body.n, params, messages=body.plain_messages(),
                       tools=plan.prompt_tools() if plan else None)
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunks = _chat_chunks(st, handles, rid, created, model, include_usage, span, plan, engine.codec)
        return EventStream(chunks, media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
    answers = await unless_disconnected(request, asyncio.gather(*(collect(h) for h in handles)))
    choices = []
    for i, a in enumerate(answers):
        st.record(span, a.metrics, a.finish_reason)
        message, finish = message_of(a.text, a.finish_reason, plan)
        choices.append({"index": i, "message": message, "logprobs": chat_logprobs(engine.codec, a.logprobs),
                        "finish_reason": finish})
    return JSONResponse({"id": rid, "object": "chat.completion", "created": created, "model": model,
                         "system_fingerprint": None, "choices": choices,
                         "usage": usage(handles[0].input_tokens, [a.metrics for a in answers])}, headers=headers)


async def _chat_chunks(st: Any, handles: list[RequestHandle], rid: str, created: int, model: str,
                       include_usage: bool, span: Any, plan: ToolPlan | None = None,
                       codec: Any = None) -> AsyncIterator[str]:
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": None}
    extra = {"usage": None} if include_usage else {}
    for i in range(len(handles)):
        yield sse({**base, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}], **extra})
    finals = []
    parsers = [plan.parser() if plan else None for _ in handles]
    legacy = bool(plan and plan.legacy)
    held: list[list[Any]] = [[] for _ in handles]  # logprobs of tokens whose text is not out yet
    async for i, ev in merge(*handles):
        if ev.finish_reason == "error":
            yield sse(engine_error(ev).to_openai())
            return
        parser = parsers[i]
        if parser is None:
            deltas = [{"content": ev.text}] if ev.text else []
        else:  # tool calls: their arguments go out as they are generated
            pieces = parser.feed(ev.text) + (parser.finish() if ev.finished else [])
            deltas = [delta_of(d, legacy) for d in pieces if d.index >= 0 or d.content]
        held[i] += ev.logprobs or []
        for delta in deltas:
            lp = chat_logprobs(codec, held[i]) if held[i] else None
            held[i] = []
            yield sse({**base, "choices": [{"index": i, "delta": delta, "logprobs": lp,
                                            "finish_reason": None}], **extra})
        if ev.finished:
            st.record(span, ev.metrics, ev.finish_reason)
            finals.append(ev.metrics)
            finish = ev.finish_reason
            if parser is not None and parser.calls and finish == "stop":
                finish = "function_call" if legacy else "tool_calls"
            yield sse({**base, "choices": [{"index": i, "delta": {},
                                            "logprobs": chat_logprobs(codec, held[i]) if held[i] else None,
                                            "finish_reason": finish}], **extra})
    if include_usage:
        yield sse({**base, "choices": [], "usage": usage(handles[0].input_tokens, finals)})
    yield sse("[DONE]")


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Any:
    st = state_of(request)
    engine = await st.engine_for(body.model, body.keep_alive)
    model = engine.model_id
    span = span_of(request)
    span.set(model=model, provider="local", execution_provider=engine.model.choice.device)
    defaults = defaults_for(st.settings, engine.model.dir)
    params: SamplingParams = body.to_sampling_params(st.settings.default_max_tokens, st.settings.max_tokens_cap,
                                                     defaults=defaults)
    headers = body.sampling_headers(params, defaults)
    params = constrain(engine, params, response_constraint(body.response_format))
    params = replace(params, logprobs=body.logprobs)
    prompts = body.prompts()
    handles: list[RequestHandle] = []
    try:
        for p in prompts:
            handles += submit_n(engine, body.n, params, prompt=p)
    except Exception:
        for h in handles:
            engine.core.abort(h.id)
        raise
    rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    prompt_tokens = sum(h.input_tokens for h in handles[::body.n])
    echo = [prompts[i // body.n] if body.echo else "" for i in range(len(handles))]
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventStream(_completion_chunks(st, handles, rid, created, model, include_usage, echo,
                                              prompt_tokens, span, engine.codec),
                           media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
    answers = await unless_disconnected(request, asyncio.gather(*(collect(h) for h in handles)))
    for a in answers:
        st.record(span, a.metrics, a.finish_reason)
    return JSONResponse({
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": i, "text": echo[i] + a.text, "finish_reason": a.finish_reason,
                     "logprobs": completion_logprobs(engine.codec, a.logprobs, len(echo[i]))}
                    for i, a in enumerate(answers)],
        "usage": usage(prompt_tokens, [a.metrics for a in answers])}, headers=headers)


async def _completion_chunks(st: Any, handles: list[RequestHandle], rid: str, created: int, model: str,
                             include_usage: bool, echo: list[str], prompt_tokens: int,
                             span: Any, codec: Any = None) -> AsyncIterator[str]:
    base = {"id": rid, "object": "text_completion", "created": created, "model": model}
    extra = {"usage": None} if include_usage else {}
    for i, prefix in enumerate(echo):
        if prefix:
            yield sse({**base, "choices": [{"index": i, "text": prefix, "logprobs": None, "finish_reason": None}]})
    finals = []
    offsets = [len(prefix) for prefix in echo]
    async for i, ev in merge(*handles):
        if ev.finish_reason == "error":
            yield sse(engine_error(ev).to_openai())
            return
        if ev.text or ev.finished:
            lp = completion_logprobs(codec, ev.logprobs, offsets[i])
            offsets[i] += len(ev.text)
            yield sse({**base, "choices": [{"index": i, "text": ev.text, "logprobs": lp,
                                            "finish_reason": ev.finish_reason if ev.finished else None}], **extra})
        if ev.finished:
            st.record(span, ev.metrics, ev.finish_reason)
            finals.append(ev.metrics)
    if include_usage:
        yield sse({**base, "choices": [], "usage": usage(prompt_tokens, finals)})
    yield sse("[DONE]")
