"""The provider contract: a neutral chat request, what a provider declares it can do, and
what it sends back. Providers are pure request/response transforms; the router decides
which one answers and what to do when one fails."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from ortserve.errors import InvalidRequest
from ortserve.types import SamplingParams, Usage

PRIVACY_LEVELS = ("low", "medium", "high")
COMPLEXITY_LEVELS = ("low", "medium", "high")
Privacy = Literal["low", "medium", "high"]
Complexity = Literal["low", "medium", "high"]

HINT_HEADERS = {
    "x-ortserve-privacy": "privacy",
    "x-ortserve-local-only": "local_only",
    "x-ortserve-complexity": "complexity",
    "x-ortserve-agent-type": "agent_type",
}


@dataclass(frozen=True)
class Hints:
    """What the caller tells the router about a request. None means "not said"."""

    privacy: Privacy | None = None
    local_only: bool = False
    complexity: Complexity | None = None
    agent_type: str | None = None

    @property
    def private(self) -> bool:
        """True when the request must never leave this machine."""
        return self.local_only or self.privacy == "high"

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> Hints:
        """From OpenAI `metadata` (privacy, local_only, complexity, agent_type; camelCase too)."""
        def get(*names: str) -> Any:
            for n in names:
                if n in values and values[n] not in (None, ""):
                    return values[n]
            return None

        privacy = _level(get("privacy"), "privacy", PRIVACY_LEVELS)
        complexity = _level(get("complexity"), "complexity", COMPLEXITY_LEVELS)
        agent = get("agent_type", "agentType")
        return cls(privacy=privacy, local_only=_flag(get("local_only", "localOnly")),  # type: ignore[arg-type]
                   complexity=complexity, agent_type=str(agent) if agent is not None else None)  # type: ignore[arg-type]

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> Hints:
        """From X-Ortserve-Privacy, X-Ortserve-Local-Only, X-Ortserve-Complexity, X-Ortserve-Agent-Type."""
        lowered = {k.lower(): v for k, v in headers.items()}
        return cls.parse({name: lowered[h] for h, name in HINT_HEADERS.items() if h in lowered})

    @classmethod
    def from_request(cls, metadata: Mapping[str, Any] | None, headers: Mapping[str, str] | None) -> Hints:
        """What the server calls: OpenAI `metadata` fields, then X-Ortserve-* headers on top."""
        return cls.parse(metadata or {}).merged(cls.from_headers(headers or {}))

    def merged(self, other: Hints) -> Hints:
        """`other` wins where it says something; privacy only ever tightens."""
        privacy = other.privacy or self.privacy
        if "high" in (self.privacy, other.privacy):
            privacy = "high"
        return Hints(privacy=privacy, local_only=self.local_only or other.local_only,
                     complexity=other.complexity or self.complexity,
                     agent_type=other.agent_type or self.agent_type)


def _level(v: Any, name: str, allowed: tuple[str, ...]) -> str | None:
    if v is None:
        return None
    s = str(v).strip().lower()
    if s == "normal":
        s = "medium"
    if s not in allowed:
        raise InvalidRequest(f"'{name}' must be one of {', '.join(allowed)}, got {v!r}",
                             param=f"metadata.{name}")
    return s


def _flag(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if v is None:
        return False
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise InvalidRequest(f"'local_only' must be true or false, got {v!r}", param="metadata.local_only")


@dataclass(frozen=True)
class ChatRequest:
    """A provider-neutral chat request.

    model: None or "auto" lets the router pick; a provider name ("anthropic") or
    "provider:model" ("openrouter:openai/gpt-4o-mini") pins it. provider: set by
    `ortserve ask --provider`; it pins the provider and keeps the model choice."""

    messages: list[dict[str, Any]]  # OpenAI shape: assistant `tool_calls`, `tool` messages with `tool_call_id`
    params: SamplingParams = field(default_factory=SamplingParams)
    hints: Hints = field(default_factory=Hints)
    model: str | None = None
    provider: str | None = None
    request_id: str | None = None
    # OpenAI's fields, already checked (server/routed.py); each provider carries them in its protocol
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None

    def prompt_text(self) -> str:
        return "\n".join(str(m.get("content") or "") for m in self.messages)

    @property
    def wants_tools(self) -> bool:
        """True when the answer may be a tool call (tools given and tool_choice is not 'none')."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def has_tool_parts(self) -> bool:
        """True when any tool field is set or the history holds tool calls or results."""
        return self.tools is not None or self.tool_choice is not None or self.parallel_tool_calls is not None \
            or any(m.get("tool_calls") or m.get("role") == "tool" for m in self.messages)

    @property
    def structured(self) -> bool:
        """True when response_format asks for JSON (json_object or json_schema)."""
        return bool(self.response_format) and (self.response_format or {}).get("type") != "text"


@dataclass(frozen=True)
class Capabilities:
    streaming: bool = True
    tools: bool = False
    max_context: int | None = None
    local: bool = False  # True: the request never leaves this machine


@dataclass
class Completion:
    """What a provider returns for a whole (non-streamed) answer."""

    text: str
    usage: Usage
    finish_reason: str
    model: str
    tool_calls: list[dict[str, Any]] | None = None  # OpenAI message.tool_calls: {id, type, function{name, arguments}}
    logprobs: list[dict[str, Any]] | None = None    # OpenAI choice.logprobs.content entries, when asked for


@dataclass
class Delta:
    """A piece of streamed text, or of tool calls in OpenAI's delta shape: the first piece of a
    call has {index, id, type, function{name, arguments: ""}}, later ones {index, function{arguments}}."""

    text: str = ""
    tool_calls: list[dict[str, Any]] | None = None
    logprobs: list[dict[str, Any]] | None = None  # OpenAI logprobs.content entries of this piece's tokens


@dataclass
class Done:
    """The end of a provider stream: usage as the provider reported it."""

    usage: Usage
    finish_reason: str
    model: str


StreamEvent = Delta | Done


class ProviderOptions(BaseModel):
    """Base for each provider's typed options; unknown keys are an error, not a silent no-op."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


@runtime_checkable
class Provider(Protocol):
    name: str
    capabilities: Capabilities

    @property
    def ready(self) -> bool:
        """False when the provider cannot be called at all (no key, no engine)."""

    @property
    def not_ready_reason(self) -> str | None: ...

    def default_model(self) -> str: ...

    def resolve_model(self, model: str | None) -> str:
        """A model alias from the config ("fast") or id to the id sent upstream."""

    async def chat(self, request: ChatRequest, model: str) -> Completion: ...

    def stream(self, request: ChatRequest, model: str) -> AsyncIterator[StreamEvent]:
        """Deltas then one Done. Raises ProviderError before the first event when the
        provider failed before answering (the router may then try the next one)."""

    def refusal(self, request: ChatRequest) -> InvalidRequest | None:
        """The 400 this provider would give `request` (a field its protocol cannot carry), or None.
        The router skips a refusing provider; when every candidate refuses, the caller gets the 400."""

    async def aclose(self) -> None: ...


def merge_tool_calls(calls: list[dict[str, Any]], pieces: list[dict[str, Any]]) -> None:
    """Add streamed tool-call pieces (Delta.tool_calls) to whole calls, by index."""
    for piece in pieces:
        i = int(piece.get("index", 0))
        while len(calls) <= i:
            calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        fn = piece.get("function") or {}
        if piece.get("id"):
            calls[i]["id"] = piece["id"]
        if fn.get("name"):
            calls[i]["function"]["name"] = fn["name"]
        calls[i]["function"]["arguments"] += fn.get("arguments") or ""


def refuse(provider: str, param: str, why: str) -> InvalidRequest:
    """A provider's refusal of one request field."""
    return InvalidRequest(f"'{param}' cannot be sent to provider {provider!r}: {why}", param=param,
                          code="unsupported_parameter")


def resolve_alias(models: Mapping[str, str], model: str | None) -> str:
    """Config `models` maps aliases to ids; "default" (or the first entry) answers None."""
    if model is None or model in ("", "default", "auto"):
        if "default" in models:
            return models["default"]
        if models:
            return next(iter(models.values()))
        raise InvalidRequest("provider has no models configured")
    return models.get(model, model)


_KEYISH = re.compile(r"(sk-[A-Za-z0-9_\-]{6,}|(?i:bearer)\s+[A-Za-z0-9_\-\.]{6,})")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Remove every secret (and anything shaped like an API key) from text bound for
    logs or error messages. Upstream error bodies sometimes echo the key back."""
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, "***")
            # Some APIs echo a truncated key ("sk-abc...xyz"); hide its visible head too.
            if len(s) >= 12:
                text = text.replace(s[:8], "***")
    return _KEYISH.sub("***", text)
