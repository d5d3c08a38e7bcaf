"""Anthropic's Messages API: POST /v1/messages and /v1/messages/count_tokens.

What Claude Code and anything built on the anthropic SDK speak. Content blocks (text, tool_use,
tool_result) become the internal chat turn (server/conversation.py), and its events come back as
content blocks, streamed with Anthropic's event sequence. Errors use Anthropic's shape
(``{"type": "error", "error": {"type", "message"}}``, see ``anthropic_error``), and the
``x-api-key`` header is honoured like the bearer token (server/app.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from ortserve.engine.reasoning import effort_budget
from ortserve.errors import InvalidRequest, OrtServeError
from ortserve.server.conversation import (
    CallArguments,
    CallStart,
    ChatTurn,
    Conversation,
    Finished,
    ReasoningDelta,
    TextDelta,
    Usage,
    count_prompt,
    error_of,
)
from ortserve.server.hosted_tools import Hosted, is_anthropic_server_tool, note_dropped
from ortserve.server.protocol import _Contract
from ortserve.server.published import ANTHROPIC
from ortserve.server.sse import SSE_HEADERS, EventStream, sse_event
from ortserve.server.state import ServerState, state_of
from ortserve.telemetry import span_of

router = APIRouter()

STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error", 529: "overloaded_error"}


def anthropic_error(err: OrtServeError) -> dict[str, Any]:
    """An ortserve error in Anthropic's shape (the field it names goes in the message)."""
    kind = ERROR_TYPES.get(err.status, "invalid_request_error" if err.status < 500 else "api_error")
    where = f" (field: {err.param})" if err.param and err.param not in err.message else ""
    return {"type": "error", "error": {"type": kind, "message": err.message + where}}


def is_messages_path(path: str) -> bool:
    return path.startswith("/v1/messages")


class MessagesRequest(_Contract):
    model: str = Field(json_schema_extra=ANTHROPIC["model"])
    max_tokens: int = Field(ge=1)
    messages: list[dict[str, Any]] = Field(min_length=1, json_schema_extra=ANTHROPIC["messages"])
    system: str | list[dict[str, Any]] | None = Field(None, json_schema_extra=ANTHROPIC["system"])
    stop_sequences: list[str] | None = Field(None, json_schema_extra=ANTHROPIC["stop_sequences"])
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, json_schema_extra=ANTHROPIC["top_p"])
    top_k: int | None = Field(None, json_schema_extra=ANTHROPIC["top_k"])
    tools: list[dict[str, Any]] | None = Field(None, json_schema_extra=ANTHROPIC["tools"])
    tool_choice: dict[str, Any] | None = Field(None, json_schema_extra=ANTHROPIC["tool_choice"])
    metadata: dict[str, Any] | None = None   # user_id: for abuse tracking at Anthropic; no local meaning
    thinking: dict[str, Any] | None = Field(None, json_schema_extra=ANTHROPIC["thinking"])
    # clear_thinking edits only: there is no thinking to clear (Claude Code sends one)
    context_management: dict[str, Any] | None = None
    # effort: a thinking model's reasoning bound when it thinks (docs/reasoning.md); format: JSON output
    output_config: dict[str, Any] | None = Field(None, json_schema_extra=ANTHROPIC["output_config"])
    # ortserve extension: a LoRA adapter's scale (docs/lora.md)
    lora_scale: float | None = Field(None, strict=True, json_schema_extra=ANTHROPIC["lora_scale"])
    IGNORED: ClassVar[frozenset[str]] = frozenset({"service_tier"})
    REFUSED: ClassVar[dict[str, str]] = {"container": "code execution containers are not supported",
                                         "mcp_servers": "MCP servers are not supported"}


class CountRequest(_Contract):
    model: str = Field(json_schema_extra=ANTHROPIC["model"])
    messages: list[dict[str, Any]] = Field(min_length=1, json_schema_extra=ANTHROPIC["messages"])
    system: str | list[dict[str, Any]] | None = Field(None, json_schema_extra=ANTHROPIC["system"])
    tools: list[dict[str, Any]] | None = Field(None, json_schema_extra=ANTHROPIC["tools"])
    tool_choice: dict[str, Any] | None = Field(None, json_schema_extra=ANTHROPIC["tool_choice"])
    thinking: dict[str, Any] | None = Field(None, json_schema_extra=ANTHROPIC["thinking"])


def _text(blocks: Any, where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    out = []
    for j, b in enumerate(blocks or []):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise InvalidRequest(f"'{where}.{j}' must be a text block", param=f"{where}.{j}")
        out.append(b["text"])
    return "".join(out)


def _image(b: dict[str, Any], where: str) -> dict[str, Any]:
    """An image block as the internal image part: a base64 source, or a url source read as an
    image URL is (vision/images.py: file:// under the image folder; http(s) refused, never fetched)."""
    from ortserve.server.vision import image_part

    src = b.get("source") if isinstance(b.get("source"), dict) else {}
    if src.get("type") == "url":
        if not isinstance(src.get("url"), str):
            raise InvalidRequest(f"'{where}.source.url' must be a string", param=f"{where}.source.url")
        return image_part(src["url"], f"{where}.source.url")
    if src.get("type") != "base64" or not isinstance(src.get("data"), str):
        raise InvalidRequest(f"'{where}.source' must be {{type: 'base64', media_type, data}}", param=f"{where}.source")
    media = src.get("media_type") if isinstance(src.get("media_type"), str) else "image/png"
    return image_part(f"data:{media};base64,{src['data']}", f"{where}.source.data")


def messages_of(body: MessagesRequest | CountRequest) -> list[dict[str, Any]]:
    """Content blocks as plain chat messages: tool_use -> tool_calls, tool_result -> tool messages."""
    out: list[dict[str, Any]] = [{"role": "system", "content": _text(body.system, "system")}] if body.system else []
    for i, m in enumerate(body.messages):
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant", "system"):  # Claude Code sends system turns between messages
            raise InvalidRequest(f"'messages.{i}.role' must be 'user', 'assistant' or 'system'",
                                 param=f"messages.{i}.role")
        if role == "system":
            out.append({"role": "system", "content": _text(content, f"messages.{i}.content")})
            continue
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise InvalidRequest(f"'messages.{i}.content' must be a string or a list of blocks",
                                 param=f"messages.{i}.content")
        text, calls, thought = [], [], ""
        for j, b in enumerate(content):
            where = f"messages.{i}.content.{j}"
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "text" and isinstance(b.get("text"), str):
                text.append(b["text"])
            elif kind == "image" and role == "user":
                text.append(_image(b, where))
            elif kind == "tool_use" and role == "assistant":
                calls.append({"id": b.get("id"), "type": "function",
                              "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input", {}))}})
            elif kind == "tool_result" and role == "user":
                result = _text(b.get("content", ""), f"{where}.content")
                out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                            "content": ("Error: " + result) if b.get("is_error") else result})
            elif kind == "thinking" and role == "assistant" and isinstance(b.get("thinking"), str):
                thought += b["thinking"]  # a thinking model's template writes it back (Qwen3)
            elif kind == "redacted_thinking":
                continue  # encrypted: nothing a local template can write
            else:
                raise InvalidRequest(f"'{where}.type' {kind!r} is not supported here (text, tool_use in assistant "
                                     "turns, tool_result in user turns)", param=f"{where}.type")
        if text or calls or not content:
            msg: dict[str, Any] = {"role": role, "content": "".join(text) if all(isinstance(t, str) for t in text)
                                   else [{"type": "text", "text": t} if isinstance(t, str) else t for t in text]}
            if calls:
                msg["tool_calls"] = calls
            if thought:
                msg["reasoning_content"] = thought
            out.append(msg)
    return out


def tools_of(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if is_anthropic_server_tool(t):  # web search, fetch, code execution: not offered offline (hosted_tools.py)
            continue
        if not isinstance(t, dict) or "input_schema" not in t:
            kind = t.get("type") if isinstance(t, dict) else None
            raise InvalidRequest(f"'tools.{i}' must be a custom tool with 'name' and 'input_schema' (server tools "
                                 f"such as {kind!r} are not supported offline)", param=f"tools.{i}")
        out.append({"type": "function", "function": {"name": t.get("name"), "description": t.get("description", ""),
                                                      "parameters": t["input_schema"]}})
    return out or None  # only server tools: none offered


def choice_of(choice: dict[str, Any] | None) -> tuple[Any, bool | None]:
    """Anthropic tool_choice -> (OpenAI tool_choice, parallel_tool_calls)."""
    if choice is None:
        return None, None
    kind = choice.get("type")
    parallel = False if choice.get("disable_parallel_tool_use") else None
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}, parallel
    raise InvalidRequest("'tool_choice.type' must be auto, any, tool or none", param="tool_choice.type")


def _check(st: ServerState, body: MessagesRequest | CountRequest) -> None:
    # "adaptive" lets the model decide whether to think: a thinking model (Qwen3) does, and its
    # reasoning comes back as thinking blocks; "enabled" bounds it to budget_tokens (the engine closes
    # the block there) and is a 400 on a model that does not think (server/conversation.py)
    kind = (body.thinking or {}).get("type")
    if body.thinking is not None and kind not in ("disabled", "adaptive", "enabled"):
        raise InvalidRequest("'thinking.type' must be enabled, adaptive or disabled", param="thinking.type")
    budget = (body.thinking or {}).get("budget_tokens")
    if kind == "enabled" and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
        raise InvalidRequest("'thinking.budget_tokens' must be an integer >= 0 with thinking.type 'enabled'",
                             param="thinking.budget_tokens")
    if isinstance(body, MessagesRequest):
        for i, edit in enumerate((body.context_management or {}).get("edits") or []):
            if not str(edit.get("type", "")).startswith("clear_thinking"):
                raise InvalidRequest(f"context edit {edit.get('type')!r} is not supported (clear_thinking only)",
                                     param=f"context_management.edits.{i}.type")
        effort = (body.output_config or {}).get("effort")
        if effort is not None and effort not in ("low", "medium", "high", "max"):
            raise InvalidRequest("'output_config.effort' must be low, medium, high or max", param="output_config.effort")
        extra = set(body.output_config or {}) - {"effort", "format"}
        if extra:
            raise InvalidRequest(f"'output_config.{min(extra)}' is not supported",
                                 param=f"output_config.{min(extra)}")
    if st.router is not None and body.model != st.served_id and st.router.handles(body.model):
        raise InvalidRequest(f"'model' {body.model!r} is a router model; the router serves /v1/chat/completions",
                             param="model")


def thinking_of(body: MessagesRequest | CountRequest) -> bool | None:
    """As Anthropic's API: no thinking unless asked for ("adaptive": the model's own default;
    "enabled": thinking, which a model that does not think refuses)."""
    kind = (body.thinking or {}).get("type")
    return True if kind == "enabled" else None if kind == "adaptive" else False


def budget_of(body: MessagesRequest) -> int | None:
    """The reasoning bound: ``thinking.budget_tokens``, else ``output_config.effort``'s level (max: none)."""
    if (body.thinking or {}).get("type") == "enabled":
        return int(body.thinking["budget_tokens"])  # type: ignore[index]
    return effort_budget((body.output_config or {}).get("effort"))


def turn_of(body: MessagesRequest) -> ChatTurn:
    choice, parallel = choice_of(body.tool_choice)
    tools = tools_of(body.tools)
    if tools is None and choice is not None:
        choice, parallel = None, None  # Anthropic allows tool_choice without tools; it means nothing then
    return ChatTurn(messages=messages_of(body), model=body.model, max_tokens=body.max_tokens,
                    sampling={"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
                              "stop": body.stop_sequences, "lora_scale": body.lora_scale},
                    tools=tools, tool_choice=choice, parallel_tool_calls=parallel,
                    response_format=format_of(body.output_config), max_tokens_is_ceiling=True,
                    thinking=thinking_of(body), thinking_param="thinking.type" if body.thinking else None,
                    reasoning_budget=budget_of(body), names={"stop": "stop_sequences", "response_format": "output_config.format"})


def format_of(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """output_config.format {type: json_schema, schema} as the internal response format."""
    fmt = (config or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise InvalidRequest("'output_config.format.type' must be 'json_schema'", param="output_config.format.type")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.get("schema", {})}}


def usage_of(u: Usage) -> dict[str, Any]:
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
            "cache_read_input_tokens": u.cached_tokens, "cache_creation_input_tokens": 0}


@router.post("/v1/messages", response_model=None)
async def create_message(body: MessagesRequest, request: Request) -> Any:
    st = state_of(request)
    st.ready_engine()
    _check(st, body)
    dropped = list(dict.fromkeys(t["type"] for t in body.tools or [] if is_anthropic_server_tool(t)))
    note_dropped(dropped, "/v1/messages")
    conv = await Conversation.start(st, turn_of(body), span_of(request))
    conv.headers.update(Hosted(dropped).headers())
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    if body.stream:
        return EventStream(_events(conv, mid), media_type="text/event-stream", headers={**SSE_HEADERS, **conv.headers})
    [c] = await conv.choices(request)
    content: list[dict[str, Any]] = [{"type": "thinking", "thinking": c.reasoning, "signature": ""}] if c.reasoning else []
    content += [{"type": "text", "text": c.text}] if c.text or not c.tool_calls else []
    content += [{"type": "tool_use", "id": t.id, "name": t.name, "input": json.loads(t.arguments)}
                for t in c.tool_calls]
    stop = "stop_sequence" if c.stop_sequence else STOP.get(c.finish_reason, "end_turn")
    return JSONResponse({"id": mid, "type": "message", "role": "assistant", "model": conv.model, "content": content,
                         "stop_reason": stop, "stop_sequence": c.stop_sequence,
                         "usage": usage_of(conv.usage([c.metrics]))}, headers=conv.headers)


async def _events(conv: Conversation, mid: str) -> AsyncIterator[str]:
    def event(kind: str, **data: Any) -> str:
        return sse_event(kind, {"type": kind, **data})

    start_usage = {**usage_of(Usage(conv.prompt_tokens, 0)), "output_tokens": 1}
    yield event("message_start", message={"id": mid, "type": "message", "role": "assistant", "model": conv.model,
                                          "content": [], "stop_reason": None, "stop_sequence": None,
                                          "usage": start_usage})
    block, kind = -1, None  # the open content block
    blocks: dict[int, int] = {}  # tool call index -> block index
    try:
        async for ev in conv.events():
            if isinstance(ev, ReasoningDelta):
                if kind != "thinking":
                    if kind is not None:
                        yield event("content_block_stop", index=block)
                    block, kind = block + 1, "thinking"
                    yield event("content_block_start", index=block,
                                content_block={"type": "thinking", "thinking": "", "signature": ""})
                yield event("content_block_delta", index=block, delta={"type": "thinking_delta", "thinking": ev.text})
            elif isinstance(ev, TextDelta):
                if kind != "text":
                    if kind is not None:
                        yield event("content_block_stop", index=block)
                    block, kind = block + 1, "text"
                    yield event("content_block_start", index=block, content_block={"type": "text", "text": ""})
                yield event("content_block_delta", index=block, delta={"type": "text_delta", "text": ev.text})
            elif isinstance(ev, CallStart):
                if kind is not None:
                    yield event("content_block_stop", index=block)
                block, kind = block + 1, "tool_use"
                blocks[ev.index] = block
                yield event("content_block_start", index=block,
                            content_block={"type": "tool_use", "id": ev.id, "name": ev.name, "input": {}})
            elif isinstance(ev, CallArguments) and ev.arguments:
                yield event("content_block_delta", index=blocks[ev.index],
                            delta={"type": "input_json_delta", "partial_json": ev.arguments})
            elif isinstance(ev, Finished):
                if kind is not None:
                    yield event("content_block_stop", index=block)
                stop = "stop_sequence" if ev.stop_sequence else STOP.get(ev.finish_reason, "end_turn")
                yield event("message_delta", delta={"stop_reason": stop, "stop_sequence": ev.stop_sequence},
                            usage={"output_tokens": ev.metrics.output_tokens})
                yield event("message_stop")
    except Exception as exc:  # noqa: BLE001 - once streaming has started the error goes in the stream
        yield sse_event("error", anthropic_error(error_of(exc)))


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountRequest, request: Request) -> Any:
    st = state_of(request)
    st.ready_engine()
    _check(st, body)
    choice, parallel = choice_of(body.tool_choice)
    tools = tools_of(body.tools)
    turn = ChatTurn(messages=messages_of(body), model=body.model, tools=tools,
                    tool_choice=choice if tools is not None else None, parallel_tool_calls=parallel,
                    thinking=thinking_of(body), thinking_param="thinking.type" if body.thinking else None)
    return {"input_tokens": await count_prompt(st, turn)}  # the same count as a message's usage
