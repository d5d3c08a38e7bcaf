"""OpenAI chat completions (POST {baseUrl}/chat/completions): OpenRouter, OpenAI, or any
compatible server (llama.cpp, vLLM, another ortserve)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

import httpx
from pydantic import Field

from ortserve.errors import ProviderError
from ortserve.providers.base import ChatRequest, Completion, Delta, Done, StreamEvent
from ortserve.providers.http import HttpOptions, HttpProvider, iter_sse
from ortserve.types import Usage

OPENROUTER_URL = "https://openrouter.ai/api/v1"
OPENAI_URL = "https://api.openai.com/v1"


class OpenAICompatOptions(HttpOptions):
    type: Literal["openai-compatible"] = "openai-compatible"
    key_required: bool = Field(True, alias="keyRequired",
                               description="False for local servers that take no key")


class OpenAICompatProvider(HttpProvider):
    kind = "openai-compatible"
    Options = OpenAICompatOptions

    options: OpenAICompatOptions

    def __init__(self, name: str, options: OpenAICompatOptions, env: Mapping[str, str] | None = None) -> None:
        openrouter = name == "openrouter" or "openrouter.ai" in (options.base_url or "")
        self.default_base_url = OPENROUTER_URL if openrouter else OPENAI_URL
        self.default_key_env = "OPENROUTER_API_KEY" if openrouter else "OPENAI_API_KEY"
        self.key_required = options.key_required
        super().__init__(name, options, env)

    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def auth_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self._key}"} if self._key else {}

    def body(self, request: ChatRequest, model: str, stream: bool) -> dict[str, Any]:
        p = request.params
        body: dict[str, Any] = {"model": model, "messages": [dict(m) for m in request.messages],
                                "max_tokens": p.max_tokens, "temperature": p.temperature}
        optional = {"top_p": (p.top_p, 1.0), "seed": (p.seed, None),
                    "presence_penalty": (p.presence_penalty, 0.0),
                    "frequency_penalty": (p.frequency_penalty, 0.0)}
        for key, (value, default) in optional.items():
            if value != default:
                body[key] = value
        if p.stop:
            body["stop"] = list(p.stop)
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
        text = str((choice.get("message") or {}).get("content") or "")
        usage = Usage(int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0)))
        if not u:
            usage = _estimate(request, text)
        return Completion(text=text, usage=usage, finish_reason=str(choice.get("finish_reason") or "stop"),
                          model=str(data.get("model") or model))

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
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        started = True
                        parts.append(text)
                        yield Delta(text)
                    if choice.get("finish_reason"):
                        finish = str(choice["finish_reason"])
        except (httpx.TransportError, json.JSONDecodeError) as exc:
            raise self.broken_stream(exc, started) from exc
        except ProviderError:
            raise
        finally:
            await resp.aclose()
        yield Done(usage=usage or _estimate(request, "".join(parts)), finish_reason=finish, model=actual)


def _estimate(request: ChatRequest, text: str) -> Usage:
    """Servers that report no usage: ~4 characters a token."""
    return Usage(max(1, len(request.prompt_text()) // 4), max(1, len(text) // 4) if text else 0)
