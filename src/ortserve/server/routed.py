"""/v1/chat/completions through the router: `model: "auto"`, a provider, or "provider:model".

The router picks local or cloud by the request's hints and the routing rules; the answer
says who answered and why in X-Ortserve-* headers (and, non-streamed, in body["ortserve"]).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from ortserve.errors import InvalidRequest, OrtServeError
from ortserve.providers.base import ChatRequest, Delta, Hints
from ortserve.providers.structured import plan_tools, response_constraint
from ortserve.router.router import ChatResult, RouteStart
from ortserve.server.protocol import ChatCompletionRequest
from ortserve.server.sse import SSE_HEADERS, EventStream, sse, unless_disconnected
from ortserve.server.state import ServerState


def wants_router(st: ServerState, model: str | None, served: str) -> bool:
    return st.router is not None and model not in (None, served) and st.router.handles(model)


async def routed_chat(body: ChatCompletionRequest, request: Request, st: ServerState, span: Any) -> Any:
    check_routable(body)
    params = body.to_sampling_params(st.settings.default_max_tokens, st.settings.max_tokens_cap,
                                     body.effective_max_tokens())
    params = replace(params, logprobs=body.logprobs_count())  # sent where the protocol has them
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    # Fields each provider may or may not carry (seed, top_k, tools...) are checked per provider by
    # the router (Provider.refusal): one that cannot carry a set field is skipped, never sent without it.
    req = ChatRequest(messages=body.plain_messages(), params=params, model=body.model, request_id=rid,
                      hints=Hints.from_request(body.metadata, request.headers), tools=body.tools,
                      tool_choice=body.tool_choice, parallel_tool_calls=body.parallel_tool_calls,
                      response_format=body.response_format)
    if not body.stream:
        res: ChatResult = await unless_disconnected(request, st.router.chat(req))
        span.set(model=res.model, provider=res.provider)
        usage = {"prompt_tokens": res.usage.prompt_tokens, "completion_tokens": res.usage.completion_tokens,
                 "total_tokens": res.usage.total_tokens}
        message: dict[str, Any] = {"role": "assistant", "content": res.text}
        if res.tool_calls:
            message = {"role": "assistant", "content": res.text or None, "tool_calls": res.tool_calls}
        return JSONResponse({"id": rid, "object": "chat.completion", "created": created, "model": res.model,
                             "choices": [{"index": 0, "message": message,
                                          "logprobs": _logprobs(res.logprobs if body.logprobs else None),
                                          "finish_reason": res.finish_reason}],
                             "usage": usage, "ortserve": res.metadata()}, headers=res.headers())
    events = st.router.stream(req)
    start: RouteStart = await events.__anext__()  # errors before the first byte are plain HTTP errors
    span.set(model=start.model, provider=start.provider)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return EventStream(_chunks(events, start, rid, created, include_usage),
                       media_type="text/event-stream", headers={**SSE_HEADERS, **start.headers()})


def _logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return None if entries is None else {"content": entries, "refusal": None}


# Refused whoever answers: the router has no way to carry them (each says why).
NOT_ROUTED = {
    "functions": "the legacy 'functions' are not carried through the router; send 'tools'",
    "function_call": "the legacy 'function_call' is not carried through the router; send 'tool_choice'",
    "keep_alive": "keep_alive applies to a local model named in the request, not to 'auto' or a provider",
    "reasoning_effort": "reasoning_effort applies to a local thinking model, not to 'auto' or a provider",
    "thinking_token_budget": "thinking_token_budget applies to a local thinking model, not to 'auto' or a provider",
    "chat_template_kwargs": "chat_template_kwargs apply to a local model's template, not to 'auto' or a provider",
}


def check_routable(body: ChatCompletionRequest) -> None:
    """400s for what no routed provider can carry, and the tool fields' own checks (as locally)."""
    if body.n != 1:
        raise InvalidRequest("n > 1 is not supported for routed requests", param="n")
    for name, why in NOT_ROUTED.items():
        value = getattr(body, name)
        if value is not None and value is not False:  # logprobs: false is the default; keep_alive: 0 is not
            raise InvalidRequest(why, param=name, code="unsupported_parameter")
    plan_tools(body)  # tools, tool_choice, parallel_tool_calls: shape, names, a named choice in tools
    response_constraint(body.response_format)


async def _chunks(events: AsyncIterator[Any], start: RouteStart, rid: str, created: int,
                  include_usage: bool) -> AsyncIterator[str]:
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": start.model}
    yield sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None}]})
    try:
        async for ev in events:
            if isinstance(ev, Delta) and (ev.text or ev.logprobs):
                yield sse({**base, "choices": [{"index": 0, "delta": {"content": ev.text},
                                                "logprobs": _logprobs(ev.logprobs), "finish_reason": None}]})
            if isinstance(ev, Delta) and ev.tool_calls:  # each piece as the provider sent it
                yield sse({**base, "choices": [{"index": 0, "delta": {"tool_calls": ev.tool_calls},
                                                "logprobs": None, "finish_reason": None}]})
            elif isinstance(ev, ChatResult):
                yield sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": ev.finish_reason}],
                           "ortserve": ev.metadata()})
                if include_usage:
                    yield sse({**base, "choices": [], "usage": {
                        "prompt_tokens": ev.usage.prompt_tokens, "completion_tokens": ev.usage.completion_tokens,
                        "total_tokens": ev.usage.total_tokens}})
    except OrtServeError as exc:  # once streaming has started there is no silent switch
        yield sse(exc.to_openai())
        return
    yield sse("[DONE]")
