"""OpenAI's legacy text completions: POST /v1/completions (prompts in, text out; no chat template;
with ``suffix``, fill-in-the-middle in the model's FIM tokens)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ortserve.engine import RequestHandle
from ortserve.models.sampling import defaults_for
from ortserve.providers.structured import completion_logprobs, constrain, response_constraint
from ortserve.server.fim import fim_prompt
from ortserve.server.protocol import CompletionRequest
from ortserve.server.service import collect, engine_error, submit_n, usage
from ortserve.server.sse import SSE_HEADERS, EventStream, merge, sse, unless_disconnected
from ortserve.server.state import state_of
from ortserve.telemetry import span_of
from ortserve.types import SamplingParams

router = APIRouter()


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
            # fill in the middle, in the model's FIM tokens (server/fim.py); an empty suffix on a model
            # without them is a plain completion (the end of a file)
            if body.suffix or (body.suffix is not None and engine.codec.fim is not None):
                ids = fim_prompt(engine, p, body.suffix, field="suffix", repo_header=False)
                handles += submit_n(engine, body.n, params, prompt_ids=ids)
            else:
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
