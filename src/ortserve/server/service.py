"""What the routes share: submitting n copies of a request and collecting answers."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ortserve.engine import AsyncEngine, RequestHandle
from ortserve.errors import OrtServeError, RequestTimeout, Unavailable
from ortserve.types import Metrics, SamplingParams, TokenEvent


class GenerationFailed(OrtServeError):
    status = 500
    type = "server_error"
    code = "generation_failed"


@dataclass
class Answer:
    text: str
    finish_reason: str
    metrics: Metrics
    logprobs: list[Any] | None = None  # per token, when asked (TokenEvent.logprobs)
    stop_sequence: str | None = None  # the stop string that ended it (TokenEvent.stop_sequence)


def submit_n(engine: AsyncEngine, n: int, params: SamplingParams, **kw: object) -> list[RequestHandle]:
    """n independent requests; with a seed, choice i uses seed + i so choices differ but repeat."""
    handles = []
    try:
        for i in range(n):
            p = params if params.seed is None or i == 0 else replace(params, seed=params.seed + i)
            handles.append(engine.submit(params=p, **kw))  # type: ignore[arg-type]
    except OrtServeError:
        for h in handles:
            engine.core.abort(h.id)
        raise
    return handles


def engine_error(ev: TokenEvent) -> OrtServeError:
    """The error a failed request's final event stands for: 504 past its deadline, 503 when the
    engine restarted under it, else 500."""
    message = ev.error or "generation failed"
    if ev.error_code == "timeout":
        return RequestTimeout(message)
    if ev.error_code == "engine_restart":
        return Unavailable(message, retry_after=2, code="engine_restart")
    return GenerationFailed(message)


async def collect(handle: RequestHandle) -> Answer:
    parts: list[str] = []
    logprobs: list[Any] | None = None
    async for ev in handle:
        if ev.finish_reason == "error":
            raise engine_error(ev)
        parts.append(ev.text)
        if ev.logprobs is not None:
            logprobs = (logprobs or []) + ev.logprobs
        if ev.finished:
            return Answer("".join(parts), ev.finish_reason or "stop", ev.metrics,  # type: ignore[arg-type]
                          logprobs, ev.stop_sequence)
    raise GenerationFailed("generation ended without a result")  # pragma: no cover


def usage(prompt_tokens: int, metrics: list[Metrics]) -> dict[str, Any]:
    """OpenAI usage; cached_tokens: prompt tokens whose KV came from the prefix cache."""
    completion = sum(m.output_tokens for m in metrics)
    cached = max((m.cached_tokens for m in metrics), default=0)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion, "prompt_tokens_details": {"cached_tokens": cached}}
