"""Anthropic Messages API (POST /v1/messages, SSE when streaming).

OpenAI's tool fields are translated both ways: `tools` -> `tools` [{name, description,
input_schema}], `tool_choice` none/auto/required/named -> {"type": none|auto|any|tool},
`parallel_tool_calls: false` -> `disable_parallel_tool_use`; assistant `tool_calls` ->
`tool_use` blocks and `tool` messages -> `tool_result` blocks in a user turn; `tool_use` in
the answer -> `tool_calls` (streamed from `input_json_delta`). `response_format` json_object /
json_schema is answered through one forced tool whose input_schema is the schema; its input
is returned as the message content (docs/tools.md says why)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
from pydantic import Field

from ortserve.errors import InvalidRequest, ProviderError
from ortserve.providers.base import ChatRequest, Completion, Delta, Done, StreamEvent, refuse
from ortserve.providers.http import HttpOptions, HttpProvider, iter_sse
from ortserve.types import Usage

API_VERSION = "2023-06-01"
FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
          "pause_turn": "stop", "refusal": "stop"}
CHOICES = {"none": "none", "auto": "auto", "required": "any"}
JSON_TOOL = "json_output"  # the forced tool's name for response_format json_object


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

    def carries(self) -> frozenset[str]:
        return frozenset({"top_k"})

    def refusal(self, request: ChatRequest) -> InvalidRequest | None:
        err = super().refusal(request)
        if err is not None:
            return err
        if request.params.temperature > 1.0:
            return refuse(self.name, "temperature", "Anthropic's temperature range is 0 to 1")
        if request.structured:
            if request.wants_tools:
                return refuse(self.name, "response_format", "Anthropic answers JSON through a forced tool, "
                                                            "so it cannot be combined with tools unless "
                                                            "tool_choice is 'none'")
            schema = _forced_tool(request.response_format or {})["input_schema"]
            if schema.get("type", "object") != "object":
                return refuse(self.name, "response_format.json_schema.schema",
                              "Anthropic answers JSON through a tool, whose input must be an object")
        return None

    def body(self, request: ChatRequest, model: str, stream: bool) -> dict[str, Any]:
        system = "\n\n".join(str(m.get("content") or "") for m in request.messages if m.get("role") == "system")
        p = request.params
        body: dict[str, Any] = {"model": model, "max_tokens": p.max_tokens, "messages": _messages(request.messages)}
        if p.temperature != 1.0:  # 1.0 is Anthropic's default; newer models refuse temperature with top_p
            body["temperature"] = p.temperature
        if system:
            body["system"] = system
        if p.top_p < 1.0:
            body["top_p"] = p.top_p
        if p.top_k > 0:
            body["top_k"] = p.top_k
        if p.stop:
            body["stop_sequences"] = list(p.stop)
        tools, choice = _tools(request)
        if tools:
            body["tools"] = tools
        if choice:
            body["tool_choice"] = choice
        if stream:
            body["stream"] = True
        return body

    async def chat(self, request: ChatRequest, model: str) -> Completion:
        resp = await self.open(self.body(request, model, stream=False), stream=False)
        data = resp.json()
        blocks = data.get("content") or []
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        uses = [b for b in blocks if b.get("type") == "tool_use"]
        finish = FINISH.get(data.get("stop_reason") or "", "stop")
        calls = None
        if request.structured:  # the forced tool's input is the answer
            text = json.dumps(uses[0].get("input") or {}) if uses else text
            finish = "stop" if finish == "tool_calls" else finish
        elif uses:
            calls = [{"id": str(b.get("id") or ""), "type": "function",
                      "function": {"name": str(b.get("name") or ""), "arguments": json.dumps(b.get("input") or {})}}
                     for b in uses]
        u = data.get("usage") or {}
        return Completion(text=text, usage=Usage(int(u.get("input_tokens", 0)), int(u.get("output_tokens", 0))),
                          finish_reason=finish, model=str(data.get("model") or model), tool_calls=calls)

    async def stream(self, request: ChatRequest, model: str) -> AsyncIterator[StreamEvent]:
        resp = await self.open(self.body(request, model, stream=True), stream=True)
        usage, finish, actual, started = Usage(), "stop", model, False
        calls: dict[int, int] = {}  # content block index -> tool call index
        sent: set[int] = set()      # blocks whose input has had a non-empty piece
        try:
            async for event, data in iter_sse(resp):
                msg = json.loads(data)
                kind = msg.get("type", event)
                if kind == "message_start":
                    m = msg.get("message", {})
                    actual = str(m.get("model") or model)
                    usage.prompt_tokens = int((m.get("usage") or {}).get("input_tokens", 0))
                elif kind == "content_block_start":
                    block, i = msg.get("content_block") or {}, int(msg.get("index", 0))
                    if block.get("type") == "tool_use":
                        calls[i] = len(calls)
                        if not request.structured:
                            started = True
                            yield Delta(tool_calls=[{"index": calls[i], "id": str(block.get("id") or ""),
                                                     "type": "function",
                                                     "function": {"name": str(block.get("name") or ""),
                                                                  "arguments": ""}}])
                elif kind == "content_block_delta":
                    delta, i = msg.get("delta", {}), int(msg.get("index", 0))
                    if delta.get("type") == "text_delta" and delta.get("text"):
                        started = True
                        yield Delta(delta["text"])
                    elif delta.get("type") == "input_json_delta" and delta.get("partial_json") and i in calls:
                        started = True
                        sent.add(i)
                        yield _input_piece(request, calls[i], delta["partial_json"])
                elif kind == "content_block_stop":
                    i = int(msg.get("index", 0))
                    if i in calls and i not in sent:  # a call without arguments: still valid JSON
                        started = True
                        yield _input_piece(request, calls[i], "{}")
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
        if request.structured and finish == "tool_calls":
            finish = "stop"
        yield Done(usage=usage, finish_reason=finish, model=actual)


def _input_piece(request: ChatRequest, index: int, text: str) -> Delta:
    """A piece of a tool's input: the content under response_format, else the call's arguments."""
    if request.structured:
        return Delta(text)
    return Delta(tool_calls=[{"index": index, "function": {"arguments": text}}])


def _messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages (system ones go to `system`) as Anthropic turns: assistant tool_calls become
    tool_use blocks, tool messages tool_result blocks in a user turn; same-role turns merge."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role, text = m.get("role"), str(m.get("content") or "")
        if role == "tool":
            role = "user"
            blocks = [{"type": "tool_result", "tool_use_id": str(m.get("tool_call_id") or ""), "content": text}]
        elif role == "assistant":
            blocks = [{"type": "text", "text": text}] if text else []
            blocks += [_tool_use(c, f"messages.{i}.tool_calls.{j}") for j, c in enumerate(m.get("tool_calls") or [])]
        elif role == "user":
            blocks = [{"type": "text", "text": text}] if text else []
        else:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})
    for turn in out:  # plain text turns stay plain strings
        blocks = turn["content"]
        if not blocks:
            turn["content"] = ""
        elif len(blocks) == 1 and blocks[0]["type"] == "text":
            turn["content"] = blocks[0]["text"]
    return out


def _tool_use(call: dict[str, Any], where: str) -> dict[str, Any]:
    fn = call.get("function") or {}
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except ValueError as exc:
        raise InvalidRequest(f"'{where}.function.arguments' is not JSON, and Anthropic takes a tool call's "
                             f"input as a JSON object: {exc}", param=f"{where}.function.arguments") from exc
    if not isinstance(args, dict):
        raise InvalidRequest(f"'{where}.function.arguments' must be a JSON object for Anthropic",
                             param=f"{where}.function.arguments")
    return {"type": "tool_use", "id": str(call.get("id") or ""), "name": str(fn.get("name") or ""), "input": args}


def _forced_tool(rf: dict[str, Any]) -> dict[str, Any]:
    """response_format as the one tool the model must call."""
    if rf.get("type") == "json_object":
        return {"name": JSON_TOOL, "description": "Give the answer as a JSON object.",
                "input_schema": {"type": "object"}}
    spec = rf.get("json_schema") or {}
    tool: dict[str, Any] = {"name": spec.get("name") or JSON_TOOL,
                            "description": spec.get("description") or "Give the answer in this JSON schema.",
                            "input_schema": spec.get("schema") or {"type": "object"}}
    if spec.get("strict"):
        tool["strict"] = True
    return tool


def _tools(request: ChatRequest) -> tuple[list[dict[str, Any]] | None, dict[str, Any] | None]:
    tools: list[dict[str, Any]] = []
    for t in request.tools or []:
        fn = t.get("function") or {}
        tool = {"name": fn.get("name"), "input_schema": fn.get("parameters") or {"type": "object"}}
        if fn.get("description"):
            tool["description"] = fn["description"]
        if fn.get("strict"):
            tool["strict"] = True
        tools.append(tool)
    if request.structured:
        forced = _forced_tool(request.response_format or {})
        return [*tools, forced], {"type": "tool", "name": forced["name"]}
    if not tools:
        return None, None
    tc, choice = request.tool_choice, None
    if isinstance(tc, dict):
        choice = {"type": "tool", "name": (tc.get("function") or {}).get("name")}
    elif tc is not None:
        choice = {"type": CHOICES[tc]}
    if request.parallel_tool_calls is False and (choice or {}).get("type") != "none":
        choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
    return tools, choice
