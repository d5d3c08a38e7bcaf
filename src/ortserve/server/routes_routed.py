"""/v1/chat/completions through the router: `model: "auto"`, a provider, or "provider:model".

The router picks local or cloud by the request's hints and the routing rules; the answer
says who answered and why in X-Ortserve-* headers (and, non-streamed, in body["ortserve"]).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from ortserve.errors import InvalidRequest, OrtServeError
from ortserve.providers.base import ChatRequest, Delta, Hints
from ortserve.router.router import ChatResult, RouteStart
from ortserve.server.protocol import ChatCompletionRequest
from ortserve.server.sse import SSE_HEADERS, EventStream, sse, unless_disconnected
from ortserve.server.state import ServerState


def wants_router(st: ServerState, model: str | None, served: str) -> bool:
    return st.router is not None and model not in (None, served) and st.router.handles(model)


async def routed_chat(body: ChatCompletionRequest, request: Request, st: ServerState, span: Any) -> Any:
    if body.n != 1:
        raise InvalidRequest("n > 1 is not supported for routed requests", param="n")
    for name in ("tools", "tool_choice", "functions", "function_call", "response_format",
                 "min_p", "typical_p", "logit_bias"):
        if getattr(body, name) is not None:  # refused, not dropped: the router does not carry them yet
            raise InvalidRequest(f"'{name}' is served by the local model only; not yet passed through the "
                                 "router to cloud providers", param=name)
    params = body.to_sampling_params(st.settings.default_max_tokens, st.settings.max_tokens_cap,
                                     body.effective_max_tokens())
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    req = ChatRequest(messages=body.plain_messages(), params=params, model=body.model, request_id=rid,
                      hints=Hints.from_request(body.metadata, request.headers))
    if not body.stream:
        res: ChatResult = await unless_disconnected(request, st.router.chat(req))
        span.set(model=res.model, provider=res.provider)
        usage = {"prompt_tokens": res.usage.prompt_tokens, "completion_tokens": res.usage.completion_tokens,
                 "total_tokens": res.usage.total_tokens}
        return JSONResponse({"id": rid, "object": "chat.completion", "created": created, "model": res.model,
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": res.text},
                                          "logprobs": None, "finish_reason": res.finish_reason}],
                             "usage": usage, "ortserve": res.metadata()}, headers=res.headers())
    events = st.router.stream(req)
    start: RouteStart = await events.__anext__()  # errors before the first byte are plain HTTP errors
    span.set(model=start.model, provider=start.provider)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return EventStream(_chunks(events, start, rid, created, include_usage),
                       media_type="text/event-stream", headers={**SSE_HEADERS, **start.headers()})


async def _chunks(events: AsyncIterator[Any], start: RouteStart, rid: str, created: int,
                  include_usage: bool) -> AsyncIterator[str]:
    base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": start.model}
    yield sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": None}]})
    try:
        async for ev in events:
            if isinstance(ev, Delta) and ev.text:
                yield sse({**base, "choices": [{"index": 0, "delta": {"content": ev.text}, "finish_reason": None}]})
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
