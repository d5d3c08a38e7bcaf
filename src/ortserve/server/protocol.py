"""Wire models: the JSON the server accepts, each converting itself to SamplingParams.

The request contract: every field a client may send is in exactly one of three states, and
docs/api-fields.md lists them all per endpoint.

- **supported**: a field of the model below; it changes the answer as documented.
- **ignored-safe**: in ``IGNORED``; an OpenAI field with no local meaning (``user``,
  ``service_tier``...). Accepted and dropped, because it cannot change the answer.
- **refused**: in ``REFUSED`` with the reason; a 400 naming the field. A ``null`` value is the
  same as leaving the field out and is accepted.

Anything else is an unknown field: a 400 ``unknown_parameter`` naming it (``extra="forbid"``,
turned into the OpenAI error shape by server.app.validation_to_error), as OpenAI does.

Supporting a new field is one line: add it to the model (and drop it from ``REFUSED``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from ortserve.engine.reasoning import effort_budget
from ortserve.errors import InvalidRequest
from ortserve.server.published import KEEP_ALIVE, SAMPLING
from ortserve.types import SAMPLING_DEFAULT_FIELDS, SamplingDefaults, SamplingParams

# OpenAI fields with no local meaning: accepted, dropped, listed in docs/api-fields.md.
OPENAI_IGNORED = frozenset({"user", "service_tier", "prompt_cache_key", "safety_identifier"})

_TOOLS = "tools and functions are served on /v1/chat/completions"
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")
# Fields that would change the answer but that ortserve does not do. Value: why, for the 400.
OPENAI_REFUSED: dict[str, str] = {
    "tools": _TOOLS, "tool_choice": _TOOLS, "parallel_tool_calls": _TOOLS,
    "functions": _TOOLS, "function_call": _TOOLS,
    "top_logprobs": "logprobs are served on /v1/chat/completions and /v1/completions",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "reasoning_effort": "reasoning is served on /v1/chat/completions",
    "verbosity": "the served models have no verbosity control",
    "web_search_options": "web search is not supported (ortserve is offline)",
    # llama.cpp / Ollama names that do not map exactly onto ours
    "repeat_penalty": "llama.cpp's repeat_penalty only looks at the last repeat_last_n tokens; "
                      "use repetition_penalty (whole context)",
    "repeat_last_n": "not supported; repetition_penalty covers the whole context",
    "penalize_nl": "not supported",
    "num_predict": "use max_tokens",
    "n_predict": "use max_tokens",
    "mirostat": "mirostat sampling is not supported",
    "mirostat_tau": "mirostat sampling is not supported",
    "mirostat_eta": "mirostat sampling is not supported",
    "tfs_z": "tail-free sampling is not supported",
    "top_n_sigma": "top-n-sigma sampling is not supported",
    "dry_multiplier": "DRY sampling is not supported",
    "xtc_probability": "XTC sampling is not supported",
    "grammar": "grammars are not supported",
    "json_schema": "JSON schemas are not supported",
    "cache_prompt": "not supported",
}


def _refuse(field: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"'{field}' is not supported by ortserve: {why}", param=field,
                          code="unsupported_parameter")


class _Contract(BaseModel):
    """A request body: unknown fields are a 400, allow-listed ones dropped, refused ones a 400."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    IGNORED: ClassVar[frozenset[str]] = frozenset()
    REFUSED: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _contract(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for key, value in data.items():
            if key in cls.REFUSED and value is not None:
                raise _refuse(key, cls.REFUSED[key])
        return {k: v for k, v in data.items() if k not in cls.IGNORED and k not in cls.REFUSED}


class Message(_Contract):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = ""
    tool_calls: list[dict[str, Any]] | None = None  # assistant: the calls it made
    tool_call_id: str | None = None                 # tool: the call this result answers
    reasoning_content: str | None = None            # assistant: a thinking model's reasoning, as returned
    # What the openai client echoes back on assistant messages (null or empty): accepted as such.
    IGNORED: ClassVar[frozenset[str]] = frozenset({"annotations"})
    REFUSED: ClassVar[dict[str, str]] = {
        "name": "participant names are not part of the served models' chat templates",
        "function_call": "legacy function_call history is not supported; send tool_calls",
        "audio": "audio is not supported", "refusal": "refusal messages are not supported",
    }

    @field_validator("content")
    @classmethod
    def _text_and_image_parts(cls, parts: Any) -> Any:
        if isinstance(parts, list):
            for p in parts:
                kind = p.get("type")
                if kind == "image_url":  # its URL is checked where it is read (server/vision.py), naming it
                    if not isinstance(p.get("image_url"), dict) or not isinstance(p["image_url"].get("url"), str):
                        raise ValueError("an image_url part needs image_url: {url: 'data:image/...;base64,...'}")
                elif kind != "text" or not isinstance(p.get("text"), str):
                    raise ValueError(f"content parts of type {kind!r} are not supported (text and image_url)")
        return parts

    @field_validator("tool_calls")
    @classmethod
    def _function_calls(cls, calls: Any) -> Any:
        for c in calls or []:
            fn = c.get("function")
            if c.get("type", "function") != "function" or not isinstance(fn, dict) \
                    or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments", ""), str):
                raise ValueError("each tool call needs type 'function' and function {name, arguments (a JSON string)}")
        return calls

    def plain(self, index: int = 0) -> dict[str, Any]:
        content: Any = self.content
        if isinstance(content, list) and any(p["type"] == "image_url" for p in content):
            from ortserve.server.vision import image_part  # images stay parts: server/vision.py reads them

            content = [image_part(p["image_url"]["url"], f"messages.{index}.content.{j}.image_url.url")
                       if p["type"] == "image_url" else p for j, p in enumerate(content)]
        elif isinstance(content, list):  # OpenAI content parts: all text (checked above)
            content = "".join(p["text"] for p in content)
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": content or ""}
        if self.tool_calls is not None:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning_content:  # Qwen3's template writes it back for the turns after the last question
            out["reasoning_content"] = self.reasoning_content
        return out


def _check_messages(data: Any) -> Any:
    """Name a refused message field with its path (messages.2.tool_calls), like pydantic's locs."""
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        for i, m in enumerate(data["messages"]):
            if isinstance(m, dict):
                for key, value in m.items():
                    if key in Message.REFUSED and value is not None:
                        raise _refuse(f"messages.{i}.{key}", Message.REFUSED[key])
    return data


class _Sampling(_Contract):
    model: str | None = None
    temperature: float | None = Field(None, json_schema_extra=SAMPLING["temperature"])
    top_p: float | None = Field(None, json_schema_extra=SAMPLING["top_p"])
    top_k: int | None = Field(None, json_schema_extra=SAMPLING["top_k"])
    min_p: float | None = Field(None, json_schema_extra=SAMPLING["min_p"])
    typical_p: float | None = Field(None, json_schema_extra=SAMPLING["typical_p"])
    logit_bias: dict[str, float] | None = Field(None, json_schema_extra=SAMPLING["logit_bias"])
    max_tokens: int | None = Field(None, json_schema_extra=SAMPLING["max_tokens"])
    min_tokens: int | None = Field(None, json_schema_extra=SAMPLING["min_tokens"])
    seed: int | None = Field(None, json_schema_extra=SAMPLING["seed"])
    stop: str | list[str] | None = Field(None, json_schema_extra=SAMPLING["stop"])
    repetition_penalty: float | None = Field(None, json_schema_extra=SAMPLING["repetition_penalty"])
    presence_penalty: float | None = Field(None, json_schema_extra=SAMPLING["presence_penalty"])
    frequency_penalty: float | None = Field(None, json_schema_extra=SAMPLING["frequency_penalty"])
    # seconds or "5m"; 0 = unload after, -1 = keep (server/manager.py)
    keep_alive: float | str | None = Field(None, json_schema_extra=KEEP_ALIVE)
    # not published as > 0 (it is checked so): the fuzzer's smallest positive deadline is a 504 by design
    timeout: float | None = Field(None, description="ortserve extension: this request's deadline in seconds, "
                                  "queue time included (default: the server's `timeout`)")
    speculative: StrictBool | None = Field(None, description="ortserve extension: false turns prompt-lookup "
                                           "speculation off for this request (docs/speculative.md)")
    lora_scale: float | None = Field(None, strict=True, json_schema_extra=SAMPLING["lora_scale"],
                                     description="ortserve extension (llama-server's per-request LoRA scale): "
                                     "the adapter's scale on alpha/r, -10..10 (docs/lora.md)")

    REFUSED: ClassVar[dict[str, str]] = OPENAI_REFUSED

    @field_validator("keep_alive")
    @classmethod
    def _keep_alive(cls, v: Any) -> Any:
        from ortserve.server.manager import parse_keep_alive

        return parse_keep_alive(v)

    def to_sampling_params(self, default_max_tokens: int, max_tokens_cap: int, max_tokens: int | None = None,
                           defaults: SamplingDefaults | None = None) -> SamplingParams:
        """The engine's parameters; sampling fields left unset take ``defaults`` (the model's, then
        the server's), or SamplingParams' neutral values when there are none (routed requests)."""
        mt = max_tokens if max_tokens is not None else self.max_tokens
        defaulted = mt is None
        if mt is None:
            mt = default_max_tokens
        if mt > max_tokens_cap and max_tokens is None and "max_tokens" not in self.model_fields_set:
            mt = max_tokens_cap  # a model default (completions' 16) the client did not send: never a 400
        if mt > max_tokens_cap:
            raise InvalidRequest(f"'max_tokens' is {mt}, above this server's cap of {max_tokens_cap}",
                                 param="max_tokens")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        sampling, _ = (defaults or SamplingDefaults()).fill(self.model_dump(include=set(SAMPLING_DEFAULT_FIELDS)))
        return SamplingParams(
            **sampling, max_tokens=mt, min_tokens=self.min_tokens or 0, seed=self.seed, stop=stop,
            logit_bias=self.logit_bias or {}, presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0, timeout=self.timeout, fit_context=defaulted,
            speculative=self.speculative is not False, lora_scale=self.lora_scale)

    def sampling_headers(self, params: SamplingParams, defaults: SamplingDefaults) -> dict[str, str]:
        """X-Ortserve-Sampling: the values used; X-Ortserve-Sampling-Defaults: which were defaulted, from where."""
        _, filled = defaults.fill(self.model_dump(include=set(SAMPLING_DEFAULT_FIELDS)))
        used = ", ".join(f"{name}={getattr(params, name):g}" for name in SAMPLING_DEFAULT_FIELDS)
        return {"X-Ortserve-Sampling": used,
                "X-Ortserve-Sampling-Defaults": ", ".join(f"{n}={defaults.sources[n]}" for n in filled) or "none"}


class SeedChatRequest(_Sampling):
    """The seed's /v1/chat and /v1/chat/stream body."""

    messages: list[Message] = Field(min_length=1)
    stream: bool | None = None  # must agree with the route: /v1/chat/stream streams, /v1/chat does not
    response_format: dict[str, Any] | None = None

    def check_stream(self, streaming: bool) -> None:
        if self.stream is not None and self.stream != streaming:
            where = "/v1/chat/stream" if self.stream else "/v1/chat"
            raise InvalidRequest(f"'stream' is {str(self.stream).lower()} on this route; use {where}",
                                 param="stream")

    @model_validator(mode="before")
    @classmethod
    def _messages(cls, data: Any) -> Any:
        return _check_messages(data)

    def plain_messages(self) -> list[dict[str, str]]:
        return [m.plain(i) for i, m in enumerate(self.messages)]


class StreamOptions(_Contract):
    include_usage: bool = False
    IGNORED: ClassVar[frozenset[str]] = frozenset({"include_obfuscation"})  # padding against side channels


class FileSearch(BaseModel):
    """Extension: answer from vector stores (server/rag_chat.py, docs/rag.md)."""

    model_config = ConfigDict(extra="forbid")
    vector_store_ids: list[str] = Field(min_length=1, max_length=8)
    max_num_results: int = Field(4, ge=1, le=20)
    filters: dict[str, Any] | None = None
    search_mode: Literal["hybrid", "dense", "bm25"] = "hybrid"


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    file_search: FileSearch | None = None   # extension (issue 16): answer from vector stores
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=16)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    metadata: dict[str, Any] | None = None  # routing hints (privacy, local_only, complexity...)
    store: bool | None = None
    modalities: list[str] | None = None
    response_format: dict[str, Any] | None = None  # text | json_object | json_schema (providers/structured.py)
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None             # legacy: mapped onto tools
    function_call: str | dict[str, Any] | None = None
    # a thinking model's reasoning (Qwen3, engine/reasoning.py): "none" turns it off, the other levels
    # bound it (EFFORT_BUDGETS); a model that does not think answers the same either way
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    # vLLM's name for an exact bound on the reasoning tokens (wins over the effort's)
    thinking_token_budget: int | None = Field(None, ge=0, strict=True)
    # vLLM's and llama-server's extension, as Qwen3's model card sends it: {"enable_thinking": false};
    # SGLang's {"thinking_budget": N} is enforced here as thinking_token_budget
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's hosted web search: not available offline, so left out with a warning (server/hosted_tools.py)
    web_search_options: dict[str, Any] | None = None
    IGNORED: ClassVar[frozenset[str]] = OPENAI_IGNORED
    top_logprobs: int | None = Field(None, ge=0, le=20)
    REFUSED: ClassVar[dict[str, str]] = {k: v for k, v in OPENAI_REFUSED.items() if k not in TOOL_FIELDS
                                         and k not in ("top_logprobs", "reasoning_effort", "web_search_options")}

    @model_validator(mode="before")
    @classmethod
    def _messages(cls, data: Any) -> Any:
        return _check_messages(data)

    @field_validator("store")
    @classmethod
    def _no_store(cls, v: Any) -> Any:
        if v:
            raise ValueError("stored completions are not supported by ortserve (store: false only)")
        return v

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, v: Any) -> Any:
        if v is not None and v != ["text"]:
            raise ValueError("only the text modality is supported by ortserve")
        return v

    def plain_messages(self) -> list[dict[str, str]]:
        return [m.plain(i) for i, m in enumerate(self.messages)]

    def logprobs_count(self) -> int | None:
        """None: no logprobs; else how many top alternatives per token (top_logprobs needs logprobs)."""
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def thinking_param(self) -> str | None:
        """The field that turned thinking off, for a 400 where the model cannot (``thinking``)."""
        if self.reasoning_effort == "none":
            return "reasoning_effort"
        return "chat_template_kwargs.enable_thinking" if (self.chat_template_kwargs or {}).get(
            "enable_thinking") is False else None

    def thinking(self) -> bool | None:
        """False: a thinking model answers without reasoning (``reasoning_effort: "none"`` or
        ``chat_template_kwargs.enable_thinking: false``); None: the model's default."""
        kwargs = self.chat_template_kwargs or {}
        for key in kwargs:
            if key not in ("enable_thinking", "thinking_budget"):
                raise InvalidRequest(f"'chat_template_kwargs.{key}' is not supported (enable_thinking and "
                                     "thinking_budget only)",
                                     param=f"chat_template_kwargs.{key}", code="unsupported_parameter")
        enable = kwargs.get("enable_thinking")
        if enable is not None and not isinstance(enable, bool):
            raise InvalidRequest("'chat_template_kwargs.enable_thinking' must be true or false",
                                 param="chat_template_kwargs.enable_thinking")
        if enable is True and self.reasoning_effort == "none":
            raise InvalidRequest("'chat_template_kwargs.enable_thinking' is true but 'reasoning_effort' is "
                                 "'none'", param="chat_template_kwargs.enable_thinking")
        return False if enable is False or self.reasoning_effort == "none" else None

    def reasoning_budget(self) -> int | None:
        """The most tokens a thinking model may reason (None: no bound): ``thinking_token_budget``, else
        ``chat_template_kwargs.thinking_budget``, else the ``reasoning_effort`` level's."""
        budget = (self.chat_template_kwargs or {}).get("thinking_budget")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
            raise InvalidRequest("'chat_template_kwargs.thinking_budget' must be an integer >= 0",
                                 param="chat_template_kwargs.thinking_budget")
        if self.thinking_token_budget is not None:
            return self.thinking_token_budget
        return budget if budget is not None else effort_budget(self.reasoning_effort)


class CompletionRequest(_Sampling):
    # published non-empty: a prompt that tokenizes to nothing is a 400 (engine.prepare; "" on a model without BOS)
    prompt: str | list[str] = Field(json_schema_extra={"anyOf": [
        {"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string", "minLength": 1}}]})
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=16)
    best_of: int | None = None
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    suffix: str | None = None  # fill-in-the-middle: the code after the gap (server/fim.py, docs/tokenize_fim.md)
    max_tokens: int | None = Field(16, json_schema_extra=SAMPLING["max_tokens"])  # OpenAI's default for completions
    response_format: dict[str, Any] | None = None
    IGNORED: ClassVar[frozenset[str]] = OPENAI_IGNORED

    @model_validator(mode="after")
    def _best_of_is_n(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidRequest("'best_of' other than n is not supported by ortserve (no ranking of candidates)",
                                 param="best_of", code="unsupported_parameter")
        return self

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)
