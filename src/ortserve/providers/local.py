"""The local provider: ortserve's own AsyncEngine. Free, and nothing leaves the machine."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any, Literal, Protocol

from pydantic import Field

from ortserve.errors import InvalidRequest, Overloaded, ProviderError
from ortserve.providers.base import (
    Capabilities,
    ChatRequest,
    Completion,
    Delta,
    Done,
    ProviderOptions,
    StreamEvent,
    merge_tool_calls,
    refuse,
    resolve_alias,
)
from ortserve.types import SamplingParams, Usage

log = logging.getLogger("ortserve.providers")


class EngineLike(Protocol):
    """The part of ortserve.engine.AsyncEngine the local provider uses."""

    @property
    def model_id(self) -> str: ...

    def submit(self, *, messages: list[dict[str, Any]] | None = None, prompt: str | None = None,
               params: SamplingParams | None = None, request_id: str | None = None, **kw: Any) -> Any: ...

    async def abort(self, request_id: str) -> None: ...

    def count_tokens(self, text: str) -> int: ...


class LocalOptions(ProviderOptions):
    type: Literal["local"] = "local"
    models: dict[str, str] = Field(default_factory=dict,
                                   description="Aliases to local model ids (informational: the loaded "
                                               "engine answers)")
    max_context: int | None = Field(None, gt=0, alias="maxContext")


class LocalProvider:
    kind = "local"
    Options = LocalOptions

    def __init__(self, engine: EngineLike | None = None, name: str = "local",
                 options: LocalOptions | None = None,
                 loader: Callable[[], Awaitable[EngineLike]] | None = None,
                 planned_model: str | None = None,
                 engines: Callable[[str | None], Awaitable[EngineLike]] | None = None) -> None:
        """engine: a started AsyncEngine; or loader: loads and starts one on first use
        (planned_model names it until then). engines: the server's model manager, which
        answers for any store model by name (rules may then target any of them)."""
        self.name = name
        self.engines = engines
        self.planned_model = planned_model
        self.engine = engine
        self.loader = loader
        self._loading: asyncio.Lock | None = None
        self.options = options or LocalOptions.model_validate({})
        context = getattr(engine, "context_length", None) if engine is not None else None
        self.capabilities = Capabilities(streaming=True, tools=True, local=True,
                                         max_context=self.options.max_context or context)

    def __repr__(self) -> str:
        return f"LocalProvider(name={self.name!r}, model={self.default_model()!r})"

    @property
    def ready(self) -> bool:
        return self.engine is not None or self.loader is not None

    @property
    def not_ready_reason(self) -> str | None:
        return None if self.ready else "no local engine loaded"

    def default_model(self) -> str:
        if self.engine is not None:
            return self.engine.model_id
        if self.options.models:
            return resolve_alias(self.options.models, None)
        return self.planned_model or "local"

    def resolve_model(self, model: str | None) -> str:
        """With a model manager, the named store model (an alias first); else the loaded
        engine answers whatever was asked, so name it (one engine per server)."""
        if self.engines is not None:
            if self.options.models:
                return resolve_alias(self.options.models, model)
            return model if model and model not in ("default", "auto") else self.default_model()
        if self.engine is not None or not self.options.models:
            return self.default_model()
        return resolve_alias(self.options.models, model)

    def count_tokens(self, text: str) -> int | None:
        if self.engine is None:
            return None
        try:
            return int(self.engine.count_tokens(text))
        except Exception:  # noqa: BLE001 - an estimate is fine here
            return None

    def refusal(self, request: ChatRequest) -> InvalidRequest | None:
        """The engine takes every sampling field, tools and response_format (grammar-enforced),
        but not both of the last two at once (as on the local route)."""
        if request.wants_tools and request.structured:
            return refuse(self.name, "response_format", "the local engine cannot combine it with tools "
                                                        "unless tool_choice is 'none'")
        return None

    async def _engine(self) -> EngineLike:
        if self.engine is None and self.loader is not None:
            self._loading = self._loading or asyncio.Lock()
            async with self._loading:
                if self.engine is None:
                    log.info("local: loading the engine")
                    self.engine = await self.loader()
        if self.engine is None:
            raise ProviderError(f"{self.name}: {self.not_ready_reason}", retryable=True, status=503)
        return self.engine

    async def aclose(self) -> None:
        """The engine's owner stops it; a lazily loaded engine is ours to stop."""
        if self.loader is not None and self.engine is not None and hasattr(self.engine, "stop"):
            await self.engine.stop()
            self.engine = None

    async def chat(self, request: ChatRequest, model: str) -> Completion:
        parts: list[str] = []
        calls: list[dict[str, Any]] = []
        logprobs: list[dict[str, Any]] = []
        async for ev in self.stream(request, model):
            if isinstance(ev, Delta):
                parts.append(ev.text)
                merge_tool_calls(calls, ev.tool_calls or [])
                logprobs += ev.logprobs or []
            else:
                return Completion(text="".join(parts), usage=ev.usage, finish_reason=ev.finish_reason,
                                  model=ev.model, tool_calls=calls or None,
                                  logprobs=logprobs if request.params.logprobs is not None else None)
        raise ProviderError(f"{self.name}: stream ended without a result", retryable=False)

    async def stream(self, request: ChatRequest, model: str) -> AsyncIterator[StreamEvent]:
        engine = await self.engines(model) if self.engines is not None else await self._engine()
        if model != engine.model_id:
            log.debug("local: %s asked for, %s loaded; the loaded model answers", model, engine.model_id)
        request_id = request.request_id or f"route-{uuid.uuid4().hex[:12]}"
        params, kw, plan = _constrained(engine, request)
        try:
            handle = engine.submit(messages=request.messages, params=params, request_id=request_id, **kw)
        except Overloaded as exc:
            raise ProviderError(f"{self.name}: {exc.message}", retryable=True, status=429) from exc
        started = finished = False
        parser = plan.parser() if plan is not None else None
        try:
            async for ev in handle:
                if ev.error:
                    raise ProviderError(f"{self.name}: {ev.error}", retryable=not started)
                lp = _logprobs(engine, ev) if params.logprobs is not None else None
                if parser is None and (ev.text or lp):
                    started = True
                    yield Delta(ev.text, logprobs=lp)
                elif parser is not None:  # tool calls: arguments go out as they are generated
                    from ortserve.providers.structured import delta_of

                    for d in parser.feed(ev.text) + (parser.finish() if ev.finished else []):
                        if d.index >= 0 or d.content:
                            started = True
                            yield Delta(d.content) if d.index < 0 else Delta(tool_calls=delta_of(d)["tool_calls"])
                    if lp:
                        yield Delta(logprobs=lp)
                if ev.finished:
                    finished = True
                    m = ev.metrics
                    usage = Usage(m.input_tokens, m.output_tokens) if m else Usage()
                    finish = ev.finish_reason or "stop"
                    if parser is not None and parser.calls and finish == "stop":
                        finish = "tool_calls"
                    yield Done(usage=usage, finish_reason=finish, model=engine.model_id)
                    return
        finally:
            if not finished:  # the caller went away or something broke: free the slot
                try:
                    await engine.abort(request_id)
                except Exception as exc:  # noqa: BLE001 - best effort; the engine may be stopping
                    log.debug("local: abort of %s failed: %s", request_id, exc)
        raise ProviderError(f"{self.name}: engine stream ended early", retryable=not started)


def _logprobs(engine: Any, ev: Any) -> list[dict[str, Any]] | None:
    """The engine's (token, logprob, alternatives) as OpenAI logprobs.content entries."""
    if not ev.logprobs:
        return None
    from ortserve.providers.structured import chat_logprobs

    return chat_logprobs(engine.codec, ev.logprobs)["content"]  # type: ignore[index]


def _constrained(engine: Any, request: ChatRequest) -> tuple[SamplingParams, dict[str, Any], Any]:
    """The request's tools/response_format as the engine's grammar (providers/structured.py, as on the
    local route): (params, submit keywords, the tool plan or None)."""
    if request.tools is None and request.tool_choice is None and request.response_format is None:
        return request.params, {}, None
    from ortserve.providers.structured import constrain, plan_tools, response_constraint

    plan = plan_tools(SimpleNamespace(functions=None, function_call=None, tools=request.tools,
                                      tool_choice=request.tool_choice,
                                      parallel_tool_calls=request.parallel_tool_calls))
    plan = plan.for_engine(engine) if plan is not None else None
    params = constrain(engine, request.params, response_constraint(request.response_format), plan)
    return params, ({"tools": plan.prompt_tools()} if plan is not None else {}), plan
