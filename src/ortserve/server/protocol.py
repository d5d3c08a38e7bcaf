"""Wire models: the JSON the server accepts, each converting itself to SamplingParams."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ortserve.errors import InvalidRequest
from ortserve.types import SamplingParams


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = ""

    def plain(self) -> dict[str, str]:
        content = self.content
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content or ""}


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    min_tokens: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    default_temperature: ClassVar[float] = 1.0

    def to_sampling_params(self, default_max_tokens: int, max_tokens_cap: int,
                           max_tokens: int | None = None) -> SamplingParams:
        mt = max_tokens if max_tokens is not None else self.max_tokens
        if mt is None:
            mt = default_max_tokens
        if mt > max_tokens_cap:
            raise InvalidRequest(f"'max_tokens' is {mt}, above this server's cap of {max_tokens_cap}",
                                 param="max_tokens")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            temperature=self.default_temperature if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k or 0, max_tokens=mt,
            min_tokens=self.min_tokens or 0, seed=self.seed, stop=stop,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0)


class SeedChatRequest(_Sampling):
    """The seed's /v1/chat and /v1/chat/stream body."""

    messages: list[Message] = Field(min_length=1)
    default_temperature: ClassVar[float] = 0.7

    def plain_messages(self) -> list[dict[str, str]]:
        return [m.plain() for m in self.messages]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=16)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v: Any) -> Any:
        if v:
            raise ValueError("logprobs are not supported by ortserve")
        return v

    def plain_messages(self) -> list[dict[str, str]]:
        return [m.plain() for m in self.messages]

    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=16)
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    max_tokens: int | None = 16  # OpenAI's default for completions

    @field_validator("logprobs", "suffix")
    @classmethod
    def _unsupported(cls, v: Any) -> Any:
        if v:
            raise ValueError("not supported by ortserve")
        return v

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)
