"""Anthropic Messages API (POST /v1/messages, SSE when streaming)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
from pydantic import Field

from ortserve.errors import ProviderError
from ortserve.providers.base import ChatRequest, Completion, Delta, Done, StreamEvent
from ortserve.providers.http import HttpOptions, HttpProvider, iter_sse
from ortserve.types import Usage

API_VERSION = "2023-06-01"
FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
          "pause_turn": "stop", "refusal": "stop"}


class AnthropicOptions(HttpOptions):
    type: Literal["anthropic"] = "anthropic"
    anthropic_version: str = Field(API_VERSION, alias="anthropicVersion")


class AnthropicProvider(HttpProvider):
    kind = "anthropic"
    Options = AnthropicOptions
    default_base_url = "https://api.anthropic.com"
    default_key_env = "ANTHROPIC_API_KEY"

    options: AnthropicOptions

    def url(self) -> str:
        return f"{self.base_url}/v1/messages"

    def auth_headers(self) -> dict[str, str]:
        h = {"anthropic-version": self.options.anthropic_version}
        if self._key:
            h["x-api-key"] = self._key
        return h

    def body(self, request: ChatRequest, model: str, stream: bool) -> dict[str, Any]:
        system = "\n\n".join(str(m.get("content") or "") for m in request.messages if m.get("role") == "system")
        messages = [{"role": m["role"], "content": str(m.get("content") or "")}
                    for m in request.messages if m.get("role") in ("user", "assistant")]
        p = request.params
        body: dict[str, Any] = {"model": model, "max_tokens": p.max_tokens, "messages": messages,
                                "temperature": min(p.temperature, 1.0)}  # Anthropic's range is 0..1
        if system:
            body["system"] = system
        if p.top_p < 1.0:
            body["top_p"] = p.top_p
        if p.top_k > 0:
            body["top_k"] = p.top_k
        if p.stop:
            body["stop_sequences"] = list(p.stop)
        if stream:
            body["stream"] = True
        return body

    async def chat(self, request: ChatRequest, model: str) -> Completion:
        resp = await self.open(self.body(request, model, stream=False), stream=False)
        data = resp.json()
        text = "".join(b.get("text", "") for b in data.get("content", []) if b.get("type") == "text")
        u = data.get("usage") or {}
        return Completion(text=text, usage=Usage(int(u.get("input_tokens", 0)), int(u.get("output_tokens", 0))),
                          finish_reason=FINISH.get(data.get("stop_reason") or "", "stop"),
                          model=str(data.get("model") or model))

    async def stream(self, request: ChatRequest, model: str) -> AsyncIterator[StreamEvent]:
        resp = await self.open(self.body(request, model, stream=True), stream=True)
        usage, finish, actual, started = Usage(), "stop", model, False
        try:
            async for event, data in iter_sse(resp):
                msg = json.loads(data)
                kind = msg.get("type", event)
                if kind == "message_start":
                    m = msg.get("message", {})
                    actual = str(m.get("model") or model)
                    usage.prompt_tokens = int((m.get("usage") or {}).get("input_tokens", 0))
                elif kind == "content_block_delta":
                    delta = msg.get("delta", {})
                    if delta.get("type") == "text_delta" and delta.get("text"):
                        started = True
                        yield Delta(delta["text"])
                elif kind == "message_delta":
                    finish = FINISH.get((msg.get("delta") or {}).get("stop_reason") or "", finish)
                    u = msg.get("usage") or {}
                    usage.completion_tokens = int(u.get("output_tokens", usage.completion_tokens))
                    if u.get("input_tokens"):
                        usage.prompt_tokens = int(u["input_tokens"])
                elif kind == "error":
                    err = msg.get("error") or {}
                    retryable = err.get("type") in ("overloaded_error", "api_error", "rate_limit_error")
                    raise self._failure(f"stream error {err.get('type')}: {self.error_detail(data)}",
                                        retryable=retryable and not started, status=502)
                elif kind == "message_stop":
                    break
        except (httpx.TransportError, json.JSONDecodeError) as exc:
            raise self.broken_stream(exc, started) from exc
        except ProviderError:
            raise
        finally:
            await resp.aclose()
        yield Done(usage=usage, finish_reason=finish, model=actual)
