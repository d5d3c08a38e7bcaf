"""Ollama's request bodies and the pieces every Ollama route shares: its error shape, model names,
``options`` as the internal sampling fields, ``format`` as a response format, messages and tool
calls both ways, and the timing fields of a finished answer.

Field names follow Ollama's docs (docs/api.md) and its Python client (``ollama._types``). Unknown
fields, and unknown keys of ``options``, are a 400 naming them; Ollama options that ortserve has no
equivalent for are a 400 saying why (never silently dropped).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ortserve.engine.reasoning import effort_budget
from ortserve.errors import InvalidRequest, OrtServeError
from ortserve.server import published
from ortserve.server.protocol import _Contract, _refuse
from ortserve.server.slots import parse_keep_alive
from ortserve.types import Metrics

# the Ollama API release whose shapes these routes mirror; clients (VS Code Copilot, Open WebUI)
# gate features on it, so /api/version reports it, with ortserve's own version beside it
OLLAMA_API_VERSION = "0.12.6"
_LOAD_TIME = "a load-time setting of the server, not of a request (see `ortserve config`)"
# Ollama options with no ortserve equivalent: a 400 with the reason
REFUSED_OPTIONS: dict[str, str] = {
    "mirostat": "mirostat sampling is not supported", "mirostat_tau": "mirostat sampling is not supported",
    "mirostat_eta": "mirostat sampling is not supported", "tfs_z": "tail-free sampling is not supported",
    "penalize_newline": "not supported", "num_keep": "context shifting is not done (a prompt over the context "
                                                    "is a 400, never silently cut)",
    **dict.fromkeys(("numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mmap", "use_mlock", "embedding_only", "num_thread"), _LOAD_TIME),
}


class JSONBody(APIRoute):
    """A route whose body is JSON whatever its content type: Ollama reads it so, and its docs' examples
    (``curl URL -d '{...}'``) send form-encoded headers over a JSON body."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            headers = [(k, v) for k, v in request.scope["headers"] if k != b"content-type"]
            scope = {**request.scope, "headers": [*headers, (b"content-type", b"application/json")]}
            return await handler(Request(scope, request.receive))
        return route


def is_ollama_path(path: str) -> bool:
    return path.startswith("/api/")


def ollama_error(err: OrtServeError) -> dict[str, Any]:
    """Ollama's error body: one string (the field it names goes in it)."""
    where = f" (field: {err.param})" if err.param and err.param not in err.message else ""
    return {"error": err.message + where}


def model_ref(name: str) -> str:
    """An Ollama model name as the store names it (``name:latest`` is the plain name)."""
    return name.removesuffix(":latest")


def now_iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def durations(metrics: Metrics, prompt_tokens: int) -> dict[str, Any]:
    """Ollama's counts and durations (nanoseconds) from the engine's metrics."""
    ns = 1_000_000_000
    ttft = metrics.ttft or 0.0
    return {"total_duration": int(metrics.total_latency * ns), "load_duration": 0,
            "prompt_eval_count": prompt_tokens, "prompt_eval_duration": int(ttft * ns),
            "eval_count": metrics.output_tokens, "eval_duration": int(max(0.0, metrics.total_latency - ttft) * ns)}


class Options(BaseModel):
    """``options``: the sampling fields ortserve has (unknown keys are a 400 naming them)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    temperature: float | None = Field(None, ge=0, json_schema_extra=published.SAMPLING["temperature"])
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    typical_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, json_schema_extra=published.SAMPLING["seed"])
    num_predict: int | None = Field(None, ge=-2, description="-1: until the model stops (the server's cap); "
                                    "-2: fill the context")
    stop: list[str] | str | None = Field(None, json_schema_extra=published.SAMPLING["stop"])
    repeat_penalty: float | None = Field(None, gt=0, json_schema_extra={"maximum": 10},
                                         description="over the whole context (repeat_last_n -1)")
    repeat_last_n: Literal[-1] | None = Field(None, description="-1 only: the penalty covers the whole context")
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    num_ctx: int | None = Field(None, ge=1, description="at most the model's context; bounds prompt and answer")

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                if key in REFUSED_OPTIONS and value is not None:
                    raise _refuse(f"options.{key}", REFUSED_OPTIONS[key])
            return {k: v for k, v in data.items() if k not in REFUSED_OPTIONS}
        return data

    def sampling(self) -> dict[str, Any]:
        """As ChatTurn.sampling (repeat_penalty is ortserve's repetition_penalty)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                "typical_p": self.typical_p, "seed": self.seed, "stop": self.stop,
                "repetition_penalty": self.repeat_penalty, "presence_penalty": self.presence_penalty,
                "frequency_penalty": self.frequency_penalty}


# internal field -> the name the client sent, for a 400 (ChatTurn.names)
NAMES = {"max_tokens": "options.num_predict", "stop": "options.stop", "temperature": "options.temperature",
         "top_p": "options.top_p", "top_k": "options.top_k", "min_p": "options.min_p", "seed": "options.seed",
         "repetition_penalty": "options.repeat_penalty", "response_format": "format", "tools": "tools"}


def _keep(v: Any) -> Any:
    return parse_keep_alive(v)


def _falsy(why: str) -> Callable[[Any], Any]:
    """A field validator: the field may be left out, null, false or empty; anything else is a 400 saying why."""
    def check(v: Any) -> Any:
        if v:
            raise ValueError(why)
        return v
    return check


def with_images(text: str, images: list[str] | None, param: str) -> str | list[dict[str, Any]]:
    """A message's text and its ``images`` (base64, Ollama's form) as list content: each image an
    internal image part naming its field (``messages.0.images.1``), read and checked in
    server/vision.py; images for a text-only model are a 400 there. The images come first, as
    Ollama's templates place them."""
    if not images:
        return text
    from ortserve.server.vision import image_part

    parts = [image_part(b if b.startswith("data:") else "data:image/*;base64," + b, f"{param}.{k}")
             for k, b in enumerate(images)]
    return [*parts, {"type": "text", "text": text}]


class _Generating(_Contract):
    """What /api/chat and /api/generate share."""

    model: str = Field(min_length=1)
    format: str | dict[str, Any] | None = Field(None, description='"json", or a JSON schema')
    options: Options | None = None
    stream: bool = True
    keep_alive: float | str | None = Field(None, description='seconds or "5m"; 0 unloads after, -1 keeps',
                                           json_schema_extra=published.KEEP_ALIVE)
    think: bool | Literal["high", "medium", "low"] | None = None
    logprobs: bool | None = Field(None, json_schema_extra={"enum": [False, None]})  # true: a 400 (_no_logprobs)
    top_logprobs: int | None = Field(None, json_schema_extra={"type": "null"})  # refused unless null
    REFUSED: ClassVar[dict[str, str]] = {"top_logprobs": "logprobs are served on /v1/chat/completions"}

    _keep_alive = field_validator("keep_alive")(_keep)

    _no_logprobs = field_validator("logprobs")(_falsy("logprobs are served on /v1/chat/completions and /v1/completions"))

    @field_validator("format")
    @classmethod
    def _format(cls, v: Any) -> Any:
        if isinstance(v, str) and v not in ("", "json"):
            raise ValueError('must be "json" or a JSON schema')
        return v

    def response_format(self) -> dict[str, Any] | None:
        if self.format in (None, ""):
            return None
        if self.format == "json":
            return {"type": "json_object"}
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": self.format}}

    def thinking(self) -> bool | None:
        """False turns a thinking model's reasoning off; True and the levels leave it on."""
        return False if self.think is False else None

    def reasoning_budget(self) -> int | None:
        """The levels bound the reasoning as reasoning_effort's do (EFFORT_BUDGETS); True: no bound."""
        return effort_budget(self.think) if isinstance(self.think, str) else None

    def max_tokens(self, cap: int) -> int | None:
        n = self.options.num_predict if self.options else None
        return cap if n is None or n < 0 else n


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionIn


class FunctionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    thinking: str | None = None
    images: list[str] | None = Field(None, description="base64 images, for a vision model (docs/vision.md)")
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None

    def plain(self, i: int) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": with_images(self.content or "", self.images,
                                                                         f"messages.{i}.images")}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id or f"call_{i}_{k}", "type": "function",
                                  "function": {"name": c.function.name, "arguments": json.dumps(c.function.arguments)}}
                                 for k, c in enumerate(self.tool_calls)]
        if self.thinking:
            out["reasoning_content"] = self.thinking
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


ToolCallIn.model_rebuild()


class ChatRequest(_Generating):
    messages: list[ChatMessage] = Field(default_factory=list, description="empty: load the model only")
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "required", "none"] | dict[str, Any] | None = Field(
        None, description="ortserve extension (OpenAI's values): 'required' makes the model call a tool")

    def plain_messages(self) -> list[dict[str, Any]]:
        """As plain chat messages. Ollama's tool results name the tool, not the call: each answers the
        first open call of its ``tool_name`` (else the first open call) of the assistant turn before it."""
        out, open_calls = [], []
        for i, m in enumerate(self.messages):
            msg = m.plain(i)
            if m.role == "assistant":
                open_calls = [(c["id"], c["function"]["name"]) for c in msg.get("tool_calls", [])]
            elif m.role == "tool" and "tool_call_id" not in msg and open_calls:
                hit = next((c for c in open_calls if c[1] == m.tool_name), open_calls[0])
                msg["tool_call_id"] = hit[0]
                open_calls.remove(hit)
            out.append(msg)
        return out


class GenerateRequest(_Generating):
    prompt: str = Field("", description="empty: load the model only (or unload it with keep_alive 0)")
    system: str | None = None
    suffix: str | None = Field(None, description="the text after the gap: fill-in-the-middle in the model's FIM "
                               "tokens (a model without them is a 400)")
    raw: bool | None = Field(None, description="true: the prompt as it is, without the chat template")
    images: list[str] | None = Field(None, description="base64 images, for a vision model (docs/vision.md)")
    REFUSED: ClassVar[dict[str, str]] = {
        **_Generating.REFUSED, "template": "the model's own chat template is used",
        "context": "the deprecated context token list is not supported; send the conversation to /api/chat",
        "width": "image generation is not supported", "height": "image generation is not supported",
        "steps": "image generation is not supported"}

    @model_validator(mode="after")
    def _raw_alone(self) -> GenerateRequest:
        if self.system and (self.raw or self.suffix):
            raise InvalidRequest(f"'system' does not apply to a {'raw' if self.raw else 'fill-in-the-middle'} "
                                 "prompt (no chat template is applied)", param="system")
        if self.images and (self.raw or self.suffix):
            raise InvalidRequest(f"'images' do not apply to a {'raw' if self.raw else 'fill-in-the-middle'} "
                                 "prompt (the chat template places them)", param="images")
        return self

    def prompt_ids(self) -> Callable[[Any], list[int]] | None:
        """A prompt that skips the chat template: fill-in-the-middle (``suffix``) or ``raw``."""
        from ortserve.server.fim import fim_prompt

        prompt, suffix = self.prompt, self.suffix
        if suffix:
            return lambda engine: fim_prompt(engine, prompt, suffix, field="suffix", repo_header=False)
        if self.raw:
            return lambda engine: engine.codec.encode(prompt)
        return None

    def plain_messages(self) -> list[dict[str, Any]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": with_images(self.prompt, self.images, "images")}]


class _Named(_Contract):
    """A body naming a model as ``model`` (or ``name``, Ollama's older field)."""

    model_config = ConfigDict(json_schema_extra=published.OLLAMA_NAMED)
    model: str | None = Field(None, min_length=1)
    name: str | None = Field(None, min_length=1)

    def ref(self) -> str:
        name = self.model or self.name
        if not name:
            raise InvalidRequest("'model' is required", param="model", code="missing_required_parameter")
        return model_ref(name)


class EmbedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    input: str | list[str] = Field(description="one text or several (at most 2048)",
                                   json_schema_extra=published.OLLAMA_INPUT)
    truncate: bool = True
    options: Options | None = Field(None, description="none apply to embeddings; a key is a 400",
                                    json_schema_extra=published.NO_OPTIONS)
    keep_alive: float | str | None = Field(None, json_schema_extra=published.KEEP_ALIVE)
    dimensions: int | None = Field(None, ge=1)
    _keep_alive = field_validator("keep_alive")(_keep)


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    prompt: str = Field(min_length=1, json_schema_extra=published.text())
    options: Options | None = Field(None, description="none apply to embeddings; a key is a 400",
                                    json_schema_extra=published.NO_OPTIONS)
    keep_alive: float | str | None = Field(None, json_schema_extra=published.KEEP_ALIVE)
    _keep_alive = field_validator("keep_alive")(_keep)


class ShowRequest(_Named):
    verbose: bool = False


class CopyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: str = Field(min_length=1)
    destination: str = Field(min_length=1, json_schema_extra=published.NEW_NAME)


class DeleteRequest(_Named):
    pass


class PullRequest(_Named):
    insecure: bool | None = None
    stream: bool = True


class CreateRequest(_Named):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True,
                              json_schema_extra=published.OLLAMA_CREATE)
    from_: str | None = Field(None, alias="from", min_length=1,
                              description="a local .gguf file, a Hugging Face or ONNX GenAI directory, or a model")
    stream: bool = True
    REFUSED: ClassVar[dict[str, str]] = {
        "quantize": "re-quantizing is `ortserve models convert`; imports keep a GGUF's own blocks",
        "files": "blob uploads are not supported: give 'from' a local path on the server",
        "adapters": "LoRA adapters are imported with `ortserve models import` (docs/lora.md)",
        "template": "the model's own chat template is used", "system": "send a system message instead",
        "parameters": "sampling defaults come from the model's own generation config",
        "messages": "send the conversation with each request", "license": "not supported",
        "modelfile": "Modelfiles are not supported: give 'from' a local path", "path": "give 'from' a local path"}
