"""Providers: who can answer a chat request. `local` (the ortserve engine), `anthropic`
(Messages API) and `openai-compatible` (OpenRouter, OpenAI or any compatible server)."""

from typing import Any

from ortserve.providers.anthropic import AnthropicOptions, AnthropicProvider
from ortserve.providers.base import (
    Capabilities,
    ChatRequest,
    Completion,
    Delta,
    Done,
    Hints,
    Provider,
    ProviderOptions,
    StreamEvent,
)
from ortserve.providers.local import LocalOptions, LocalProvider
from ortserve.providers.openai_compat import OpenAICompatOptions, OpenAICompatProvider

PROVIDER_TYPES: dict[str, Any] = {  # type name -> provider class (with .Options)
    "local": LocalProvider,
    "anthropic": AnthropicProvider,
    "openai-compatible": OpenAICompatProvider,
}

__all__ = [
    "PROVIDER_TYPES",
    "AnthropicOptions",
    "AnthropicProvider",
    "Capabilities",
    "ChatRequest",
    "Completion",
    "Delta",
    "Done",
    "Hints",
    "LocalOptions",
    "LocalProvider",
    "OpenAICompatOptions",
    "OpenAICompatProvider",
    "Provider",
    "ProviderOptions",
    "StreamEvent",
]
