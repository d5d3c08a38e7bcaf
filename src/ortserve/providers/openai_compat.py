"""OpenAI chat completions (POST {baseUrl}/chat/completions): OpenRouter, OpenAI, or any
compatible server (llama.cpp, vLLM, another ortserve)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator

from ortserve.errors import ProviderError
from ortserve.providers.base import ChatRequest, Completion, Delta, Done, StreamEvent
from ortserve.providers.http import SAMPLING_EXTRAS, HttpOptions, HttpProvider, iter_sse
from ortserve.types import Usage

OPENROUTER_URL = "https://openrouter.ai/api/v1"
OPENAI_URL = "https://api.openai.com/v1"
# Sampling fields outside OpenAI's protocol that compatible servers may take (vLLM takes all of them).
EXTENSIONS = ("top_k", "min_p", "typical_p", "repetition_penalty", "min_tokens")
# OpenRouter's documented parameters include these (openrouter.ai/docs/api-reference/parameters).
OPENROUTER_EXTENSIONS = ("top_k", "min_p", "repetition_penalty")
# Always sent when set: they are OpenAI's own.
OPENAI_FIELDS = ("seed", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs")


class OpenAICompatOptions(HttpOptions):
    type: Literal["openai-compatible"] = "openai-compatible"
    key_required: bool = Field(True, alias="keyRequired",
                               description="False for local servers that take no key")
    extensions: list[str] | None = Field(
        None, description="Sampling fields beyond OpenAI's that this server takes, sent when a request sets "
                          f"them: any of {', '.join(EXTENSIONS)}. Default: OpenRouter's "
                          f"({', '.join(OPENROUTER_EXTENSIONS)}) for OpenRouter, none otherwise "
                          "(a request setting one is then refused, never sent to be ignored)")

    @field_validator("extensions")
    @classmethod
    def _known(cls, v: list[str] | None) -> list[str] | None:
        bad = [x for x in v or [] if x not in EXTENSIONS]
        if bad:
            raise ValueError(f"unknown sampling field(s) {bad}; known: {', '.join(EXTENSIONS)}")
        return v


class OpenAICompatProvider(HttpProvider):
    kind = "openai-compatible"
    Options = OpenAICompatOptions

    options: OpenAICompatOptions

    def __init__(self, name: str, options: OpenAICompatOptions, env: Mapping[str, str] | None = None) -> None:
        openrouter = name == "openrouter" or "openrouter.ai" in (options.base_url or "")
        self.default_base_url = OPENROUTER_URL if openrouter else OPENAI_URL
        self.default_key_env = "OPENROUTER_API_KEY" if openrouter else "OPENAI_API_KEY"
        self.key_required = options.key_required
        default = OPENROUTER_EXTENSIONS if openrouter else ()
        self.extensions = tuple(options.extensions if options.extensions is not None else default)
        super().__init__(name, options, env)

    def carries(self) -> frozenset[str]:
        return frozenset(OPENAI_FIELDS + self.extensions)

    def why_not(self, name: str) -> str:
        if name in EXTENSIONS:
            return (f"OpenAI's protocol has no such field; if this server takes it, list it in "
                    f"providers.{self.name}.extensions in the routing config (docs/router.md)")
        return super().why_not(name)

    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def auth_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self._key}"} if self._key else {}

    def body(self, request: ChatRequest, model: str, stream: bool) -> dict[str, Any]:
        p = request.params
        body: dict[str, Any] = {"model": model, "messages": [_wire(m) for m in request.messages],
                                "max_tokens": p.max_tokens, "temperature": p.temperature}
        if p.top_p != 1.0:
            body["top_p"] = p.top_p
        for key, neutral in SAMPLING_EXTRAS.items():  # refusal() has turned away what is not carried
            value = getattr(p, key)
            if value != neutral and key in self.carries() and key != "logprobs":
                body[key] = {str(t): b for t, b in value} if key == "logit_bias" else value
        if p.stop:
            body["stop"] = list(p.stop)
        if p.logprobs is not None:  # SamplingParams.logprobs: how many top alternatives per token
            body["logprobs"] = True
            if p.logprobs:
                body["top_logprobs"] = p.logprobs
        for key in ("tools", "tool_choice", "parallel_tool_calls", "response_format"):  # unchanged
            if getattr(request, key) is not None:
                body[key] = getattr(request, key)
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def chat(self, request: ChatRequest, model: str) -> Completion:
        resp = await self.open(self.body(request, model, stream=False), stream=False)
        data = resp.json()
        if "error" in data:  # some gateways answer 200 with an error object
            raise self._failure(f"error: {self.error_detail(json.dumps(data))}", retryable=True, status=502)
        choice = (data.get("choices") or [{}])[0]
        u = data.get("usage") or {}
        message = choice.get("message") or {}
        text = str(message.get("content") or "")
        calls = [_call(c) for c in message.get("tool_calls") or []] or None
        usage = Usage(int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0)))
        if not u:
            usage = _estimate(request, text + json.dumps(calls or ""))
        return Completion(text=text, usage=usage, finish_reason=str(choice.get("finish_reason") or "stop"),
                          model=str(data.get("model") or model), tool_calls=calls,
                          logprobs=_logprobs(choice) if request.params.logprobs is not None else None)

    async def stream(self, request: ChatRequest, model: str) -> AsyncIterator[StreamEvent]:
        resp = await self.open(self.body(request, model, stream=True), stream=True)
        usage: Usage | None = None
        finish, actual, started, parts = "stop", model, False, []
        try:
            async for _event, data in iter_sse(resp):
                if data.strip() == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise self._failure(f"stream error: {self.error_detail(data)}",
                                        retryable=not started, status=502)
                actual = str(chunk.get("model") or actual)
                if chunk.get("usage"):
                    u = chunk["usage"]
                    usage = Usage(int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0)))
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text = str(delta.get("content") or "")
                    pieces = [_piece(c) for c in delta.get("tool_calls") or []] or None
                    lp = _logprobs(choice)
                    if text or pieces or lp:  # pieces go on as they come: arguments are not buffered
                        started = True
                        parts += [text, *(pc["function"].get("arguments", "") for pc in pieces or [])]
                        yield Delta(text, tool_calls=pieces, logprobs=lp)
                    if choice.get("finish_reason"):
                        finish = str(choice["finish_reason"])
        except (httpx.TransportError, json.JSONDecodeError) as exc:
            raise self.broken_stream(exc, started) from exc
        except ProviderError:
            raise
        finally:
            await resp.aclose()
        yield Done(usage=usage or _estimate(request, "".join(parts)), finish_reason=finish, model=actual)


def _wire(m: dict[str, Any]) -> dict[str, Any]:
    """A message as sent: an assistant turn that only calls tools has content null, as OpenAI sends it."""
    out = dict(m)
    if out.get("tool_calls") and not out.get("content"):
        out["content"] = None
    return out


def _logprobs(choice: dict[str, Any]) -> list[dict[str, Any]] | None:
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or not lp.get("content"):
        return None
    return list(lp["content"])


def _call(c: dict[str, Any]) -> dict[str, Any]:
    fn = c.get("function") or {}
    args = fn.get("arguments")
    return {"id": str(c.get("id") or ""), "type": "function",
            "function": {"name": str(fn.get("name") or ""),
                         "arguments": args if isinstance(args, str) else json.dumps(args or {})}}


def _piece(c: dict[str, Any]) -> dict[str, Any]:
    """One streamed tool-call piece, kept as it came (index, then id/type/name only where sent)."""
    out: dict[str, Any] = {"index": int(c.get("index") or 0)}
    if c.get("id"):
        out["id"] = str(c["id"])
        out["type"] = "function"
    fn = c.get("function") or {}
    out["function"] = {k: str(fn[k]) for k in ("name", "arguments") if fn.get(k) is not None}
    return out


def _estimate(request: ChatRequest, text: str) -> Usage:
    """Servers that report no usage: ~4 characters a token."""
    return Usage(max(1, len(request.prompt_text()) // 4), max(1, len(text) // 4) if text else 0)
