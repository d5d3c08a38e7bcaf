"""llama-server's fill-in-the-middle: POST /infill (what llama.vim and llama.vscode call).

``input_prefix`` and ``input_suffix`` around the gap, ``input_extra`` other files as
``[{filename, text}]``, ``prompt`` text that continues the prefix; the prompt is built in the
model's FIM tokens (engine/fim.py, server/fim.py) and the answer comes back in llama-server's
/completion shape (``content``, ``stop``, ``tokens_predicted``...), streamed as ``data:`` lines.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from ortserve.models.sampling import defaults_for
from ortserve.server.fim import fim_prompt
from ortserve.server.protocol import OPENAI_IGNORED, OPENAI_REFUSED, _Contract, _Sampling
from ortserve.server.service import collect, engine_error, submit_n
from ortserve.server.sse import SSE_HEADERS, EventStream, sse, unless_disconnected
from ortserve.server.state import state_of
from ortserve.telemetry import span_of

router = APIRouter()
_TIMED = "time limits on prompt and generation are not supported; set max_tokens (n_predict) or 'timeout'"


class InfillExtra(_Contract):
    filename: str = "tmp"
    text: str


class InfillRequest(_Sampling):
    input_prefix: str
    input_suffix: str
    input_extra: list[InfillExtra] | None = None
    prompt: str = ""
    stream: bool = False
    n_predict: int | None = Field(None, ge=-1)  # llama-server's max_tokens; -1: the default
    IGNORED: ClassVar[frozenset[str]] = OPENAI_IGNORED | {"cache_prompt"}  # prefix reuse is automatic
    REFUSED: ClassVar[dict[str, str]] = {
        **{k: v for k, v in OPENAI_REFUSED.items() if k not in ("n_predict", "cache_prompt")},
        "t_max_prompt_ms": _TIMED, "t_max_predict_ms": _TIMED,
        "n_indent": "indentation-based stopping is not supported; use stop",
        "samplers": "the sampler order is fixed (penalties, top-k, top-p, min-p, temperature)",
        "response_fields": "not supported; the whole answer object comes back",
    }


def _final(model: str, text: str, finish: str, stop_word: str | None, prompt_tokens: int,
           output_tokens: int) -> dict[str, Any]:
    kind = "limit" if finish == "length" else ("word" if stop_word else "eos")
    return {"content": text, "stop": True, "model": model, "tokens_predicted": output_tokens,
            "tokens_evaluated": prompt_tokens, "stop_type": kind, "stopping_word": stop_word or "",
            "truncated": False}


@router.post("/infill", response_model=None)
async def infill(body: InfillRequest, request: Request) -> Any:
    st = state_of(request)
    engine = await st.engine_for(body.model, body.keep_alive)
    span_of(request).set(model=engine.model_id, provider="local", execution_provider=engine.device)
    defaults = defaults_for(st.settings, engine.model.dir)
    max_tokens = body.n_predict if body.n_predict not in (None, -1) else None
    params = body.to_sampling_params(st.settings.default_max_tokens, st.settings.max_tokens_cap, max_tokens,
                                     defaults=defaults)
    extra = [(e.filename, e.text) for e in body.input_extra or []]
    ids = fim_prompt(engine, body.input_prefix, body.input_suffix, field="input_suffix", prompt=body.prompt,
                     extra=extra)
    [handle] = submit_n(engine, 1, params, prompt_ids=ids)
    headers = body.sampling_headers(params, defaults)
    if body.stream:
        return EventStream(_chunks(st, span_of(request), handle, engine.model_id), media_type="text/event-stream",
                           headers={**SSE_HEADERS, **headers})
    [a] = await unless_disconnected(request, asyncio.gather(collect(handle)))
    st.record(span_of(request), a.metrics, a.finish_reason)
    return JSONResponse(_final(engine.model_id, a.text, a.finish_reason, a.stop_sequence, handle.input_tokens,
                               a.metrics.output_tokens), headers=headers)


async def _chunks(st: Any, span: Any, handle: Any, model: str) -> AsyncIterator[str]:
    async for ev in handle:
        if ev.finish_reason == "error":
            yield sse({"error": engine_error(ev).to_openai()["error"]})
            return
        if ev.finished:
            st.record(span, ev.metrics, ev.finish_reason)
            yield sse(_final(model, ev.text, ev.finish_reason or "stop", ev.stop_sequence, handle.input_tokens,
                             ev.metrics.output_tokens if ev.metrics else 0))
        elif ev.text:
            yield sse({"content": ev.text, "stop": False})
