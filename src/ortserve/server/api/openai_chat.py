"""OpenAI Chat Completions: POST /v1/chat/completions, over the shared conversation layer.

A request for a router model (``auto``, a provider, ``provider:model``) goes through the router
(server/routed.py); a request with ``file_search`` answers from vector stores (server/rag_chat.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ortserve.providers.structured import chat_logprobs
from ortserve.server.conversation import (
    CallArguments,
    CallStart,
    ChatTurn,
    Conversation,
    Finished,
    ReasoningDelta,
    TextDelta,
    Usage,
    error_of,
)
from ortserve.server.hosted_tools import Hosted, note_dropped
from ortserve.server.protocol import ChatCompletionRequest
from ortserve.server.routed import routed_chat, wants_router
from ortserve.server.sse import SSE_HEADERS, EventStream, sse
from ortserve.server.state import state_of
from ortserve.telemetry import span_of

router = APIRouter()

SAMPLING = ("temperature", "top_p", "top_k", "min_p", "typical_p", "logit_bias", "min_tokens", "seed", "stop",
            "repetition_penalty", "presence_penalty", "frequency_penalty", "timeout", "speculative",
            "lora_scale")


def turn_of(body: ChatCompletionRequest) -> ChatTurn:
    """The wire request as the internal one."""
    return ChatTurn(messages=body.plain_messages(), model=body.model,
                    sampling={k: getattr(body, k) for k in SAMPLING}, max_tokens=body.effective_max_tokens(),
                    tools=body.tools, tool_choice=body.tool_choice, parallel_tool_calls=body.parallel_tool_calls,
                    response_format=body.response_format, functions=body.functions,
                    function_call=body.function_call, n=body.n, logprobs=body.logprobs_count(),
                    keep_alive=body.keep_alive, thinking=body.thinking(), thinking_param=body.thinking_param(),
                    reasoning_budget=body.reasoning_budget(),
                    names={"max_tokens": "max_completion_tokens"} if body.max_completion_tokens is not None else {})


def usage_of(u: Usage) -> dict[str, Any]:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens, "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens}}


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    if body.file_search is not None:  # answer from vector stores, with citations (server/rag_chat.py)
        from ortserve.server.rag_chat import add_to_response, apply_file_search

        cites = await apply_file_search(body, request)
        body.file_search = None
        return add_to_response(await chat_completions(body, request), cites)
    st = state_of(request)
    span = span_of(request)
    hosted = Hosted(["web_search_options"] if body.web_search_options is not None else [])
    note_dropped(hosted.dropped, "/v1/chat/completions")
    if wants_router(st, body.model, st.served_id):
        st.ready_engine()
        routed = await routed_chat(body, request, st, span)
        routed.headers.update(hosted.headers())
        return routed
    conv = await Conversation.start(st, turn_of(body), span)
    conv.headers.update(hosted.headers())  # web search was asked for and is not available offline
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    base = {"id": rid, "created": created, "model": conv.model, "system_fingerprint": None}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventStream(_chunks(conv, base, include_usage), media_type="text/event-stream",
                           headers={**SSE_HEADERS, **conv.headers})
    codec, legacy = conv.engine.codec, bool(conv.plan and conv.plan.legacy)
    choices = []
    answers = await conv.choices(request)
    for i, c in enumerate(answers):
        message: dict[str, Any] = {"role": "assistant", "content": c.text}
        if c.tool_calls and legacy:
            call = c.tool_calls[0]
            message = {"role": "assistant", "content": None,
                       "function_call": {"name": call.name, "arguments": call.arguments}}
        elif c.tool_calls:
            message = {"role": "assistant", "content": c.text or None,
                       "tool_calls": [{"id": t.id, "type": "function",
                                       "function": {"name": t.name, "arguments": t.arguments}} for t in c.tool_calls]}
        if c.reasoning:  # a thinking model's reasoning, as llama-server and vLLM return it
            message["reasoning_content"] = c.reasoning
        choices.append({"index": i, "message": message, "logprobs": chat_logprobs(codec, c.logprobs),
                        "finish_reason": c.finish_reason})
    u = conv.usage([c.metrics for c in answers])
    return JSONResponse({**base, "object": "chat.completion", "choices": choices, "usage": usage_of(u)},
                        headers=conv.headers)


def _delta(ev: ReasoningDelta | TextDelta | CallStart | CallArguments, legacy: bool) -> dict[str, Any]:
    """One event as an OpenAI chunk delta (the legacy form streams message.function_call)."""
    if isinstance(ev, ReasoningDelta):
        return {"reasoning_content": ev.text}
    if isinstance(ev, TextDelta):
        return {"content": ev.text}
    if legacy:
        if isinstance(ev, CallStart):
            return {"function_call": {"name": ev.name, "arguments": ""}}
        return {"function_call": {"arguments": ev.arguments}}
    if isinstance(ev, CallStart):
        return {"tool_calls": [{"index": ev.index, "id": ev.id, "type": "function",
                                "function": {"name": ev.name, "arguments": ""}}]}
    return {"tool_calls": [{"index": ev.index, "function": {"arguments": ev.arguments}}]}


async def _chunks(conv: Conversation, base: dict[str, Any], include_usage: bool) -> AsyncIterator[str]:
    base = {**base, "object": "chat.completion.chunk"}
    extra = {"usage": None} if include_usage else {}
    codec, legacy = conv.engine.codec, bool(conv.plan and conv.plan.legacy)

    def chunk(i: int, delta: dict[str, Any], lp: Any = None, finish: str | None = None) -> str:
        return sse({**base, "choices": [{"index": i, "delta": delta, "logprobs": chat_logprobs(codec, lp),
                                         "finish_reason": finish}], **extra})

    for i in range(len(conv.handles)):
        yield chunk(i, {"role": "assistant", "content": ""})
    finals = []
    try:
        async for ev in conv.events():
            if isinstance(ev, Finished):
                finals.append(ev.metrics)
                yield chunk(ev.choice, {}, ev.logprobs, ev.finish_reason)
            else:
                yield chunk(ev.choice, _delta(ev, legacy), ev.logprobs)
    except Exception as exc:  # noqa: BLE001 - once streaming has started the error goes in the stream
        yield sse(error_of(exc).to_openai())
        return
    if include_usage:
        yield sse({**base, "choices": [], "usage": usage_of(conv.usage(finals))})
    yield sse("[DONE]")
