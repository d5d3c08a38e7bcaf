"""OpenAI's Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

What the OpenAI Agents SDK (its default model), Codex CLI and Microsoft's Agent Framework speak.
Input items become the internal chat turn (server/conversation.py); its events come back as
output items: a ``message`` with ``output_text``, and ``function_call`` items. With ``store``
(OpenAI's default, true) the response and its conversation are kept in SQLite, so
``previous_response_id`` continues it, also after a restart.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from ortserve.engine.reasoning import EFFORT_BUDGETS, effort_budget
from ortserve.errors import InvalidRequest, NotFound, OrtServeError
from ortserve.server.api.responses_hosted import RESULTS, file_search_events, with_hosted
from ortserve.server.api.responses_input import choice_of, format_of, messages_of, namespaces_of, tools_of
from ortserve.server.conversation import (
    CallArguments,
    CallStart,
    ChatTurn,
    Choice,
    Conversation,
    Finished,
    ReasoningDelta,
    TextDelta,
    Usage,
    error_of,
)
from ortserve.server.hosted_tools import note_dropped
from ortserve.server.protocol import OPENAI_IGNORED, _Contract
from ortserve.server.responses_store import ResponseStore
from ortserve.server.sse import SSE_HEADERS, EventStream, sse_event
from ortserve.server.state import ServerState, state_of
from ortserve.server.tenancy import owner_of
from ortserve.telemetry import span_of

router = APIRouter()

# Values of `include` that ask for nothing these models produce (there is no reasoning to encrypt,
# no web search runs offline); "file_search_call.results" asks for the local search's results.
INCLUDE_NOTHING = {"reasoning.encrypted_content", "web_search_call.action.sources", "web_search_call.results"}


class ResponsesRequest(_Contract):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    include: list[str] | None = None
    # effort "none" turns a thinking model's reasoning off; the other levels bound it (EFFORT_BUDGETS in
    # engine/reasoning.py), and a model that does not think answers the same (docs/reasoning.md)
    reasoning: dict[str, Any] | None = None
    truncation: Literal["disabled"] | None = None
    keep_alive: float | str | None = None  # ortserve extension, as on chat completions
    lora_scale: float | None = Field(None, strict=True)  # ortserve extension: a LoRA adapter's scale (docs/lora.md)
    # client_metadata: a client's own ids (Codex sends its thread and installation ids); no local meaning
    IGNORED: ClassVar[frozenset[str]] = OPENAI_IGNORED | {"prompt_cache_retention", "client_metadata"}
    REFUSED: ClassVar[dict[str, str]] = {
        "background": "background responses are not supported",
        "conversation": "conversations are not supported; use previous_response_id",
        "prompt": "stored prompt templates are not supported",
        "top_logprobs": "logprobs are served on /v1/chat/completions",
        "max_tool_calls": "not supported",
        "context_management": "not supported",
        "prompt_cache_options": "not supported (prefix reuse is automatic)",
    }


def history_of(st: ServerState, body: ResponsesRequest, owner: str | None = None) -> list[dict[str, Any]]:
    if body.previous_response_id is None:
        return []
    found = store_of(st).get(body.previous_response_id, owner)   # another key's: as if missing
    if found is None:
        raise NotFound(f"no stored response {body.previous_response_id!r}", param="previous_response_id",
                       code="response_not_found")
    return found[1]


def turn_of(body: ResponsesRequest, history: list[dict[str, Any]]) -> ChatTurn:
    for v in body.include or []:
        if v not in INCLUDE_NOTHING and v != RESULTS:
            raise InvalidRequest(f"'include' value {v!r} is not supported", param="include")
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    return ChatTurn(messages=system + history + messages_of(body.input), model=body.model,
                    sampling={"temperature": body.temperature, "top_p": body.top_p, "lora_scale": body.lora_scale},
                    max_tokens=body.max_output_tokens, tools=tools_of(body.tools),
                    tool_choice=choice_of(body.tool_choice), parallel_tool_calls=body.parallel_tool_calls,
                    response_format=format_of(body.text), keep_alive=body.keep_alive,
                    thinking=False if effort_of(body.reasoning) == "none" else None,
                    thinking_param="reasoning.effort", reasoning_budget=effort_budget(effort_of(body.reasoning)),
                    names={"max_tokens": "max_output_tokens", "response_format": "text.format",
                           "messages": "input"})


def effort_of(reasoning: dict[str, Any] | None) -> str | None:
    """``reasoning.effort``: "none" turns a thinking model's reasoning off, the others bound it (EFFORT_BUDGETS)."""
    effort = (reasoning or {}).get("effort")
    if effort is not None and effort != "none" and effort not in EFFORT_BUDGETS:
        raise InvalidRequest(f"'reasoning.effort' must be one of none, {', '.join(EFFORT_BUDGETS)}; got {effort!r}",
                             param="reasoning.effort")
    return effort  # type: ignore[no-any-return]


def store_of(st: ServerState) -> ResponseStore:
    if st.responses is None:
        st.responses = ResponseStore(st.settings.home / "responses.sqlite")
    return st.responses  # type: ignore[no-any-return]


def _check_model(st: ServerState, model: str | None) -> None:
    if st.router is not None and model not in (None, st.served_id) and st.router.handles(model):
        raise InvalidRequest(f"'model' {model!r} is a router model; the router serves /v1/chat/completions",
                             param="model", code="model_not_supported")


def usage_of(u: Usage) -> dict[str, Any]:
    return {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.total_tokens}


class Shape:
    """The response object and its items for one request."""

    def __init__(self, body: ResponsesRequest, model: str, warnings: list[str] | None = None) -> None:
        self.body = body
        self.warnings = warnings or []  # hosted tools left out (server/hosted_tools.py)
        self.pre: list[dict[str, Any]] = []  # output items made before generation (a file_search_call)
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def response(self, status: str, output: list[dict[str, Any]], usage: Usage | None,
                 finish: str | None = None) -> dict[str, Any]:
        b = self.body
        fmt = (b.text or {}).get("format") or {"type": "text"}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "error": None, "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
                "instructions": b.instructions, "max_output_tokens": b.max_output_tokens, "model": self.model,
                "output": output, "parallel_tool_calls": b.parallel_tool_calls is not False,
                "previous_response_id": b.previous_response_id, "reasoning": {"effort": (b.reasoning or {}).get("effort"), "summary": None},
                "store": b.store, "temperature": b.temperature, "top_p": b.top_p,
                "text": {"format": fmt}, "tool_choice": b.tool_choice or "auto", "tools": b.tools or [],
                "truncation": "disabled", "usage": usage_of(usage) if usage else None, "user": None,
                "metadata": b.metadata or {}} | ({"ortserve_warnings": self.warnings} if self.warnings else {})


def message_item(text: str, status: str = "completed", mid: str | None = None) -> dict[str, Any]:
    return {"type": "message", "id": mid or f"msg_{uuid.uuid4().hex}", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text or
            status == "completed" else []}


def call_item(call_id: str, name: str, arguments: str, status: str = "completed", fid: str | None = None,
              namespace: str | None = None) -> dict[str, Any]:
    item = {"type": "function_call", "id": fid or f"fc_{uuid.uuid4().hex}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}
    return {**item, "namespace": namespace} if namespace else item


def reasoning_item(text: str, status: str = "completed", rid: str | None = None) -> dict[str, Any]:
    """A thinking model's reasoning as its own output item (its text in full, no summary)."""
    return {"type": "reasoning", "id": rid or f"rs_{uuid.uuid4().hex}", "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def output_of(c: Choice, namespaces: dict[str, str]) -> list[dict[str, Any]]:
    items = [reasoning_item(c.reasoning)] if c.reasoning else []
    items += [message_item(c.text)] if c.text or not c.tool_calls else []
    return items + [call_item(t.id, t.name, t.arguments, namespace=namespaces.get(t.name)) for t in c.tool_calls]


def history_after(body: ResponsesRequest, turn: ChatTurn, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation to store: this turn's messages without instructions, and its output."""
    return turn.messages[1 if body.instructions else 0:] + messages_of(output)


@router.post("/v1/responses", response_model=None)
async def create_response(body: ResponsesRequest, request: Request) -> Any:
    st = state_of(request)
    st.ready_engine()
    _check_model(st, body.model)
    owner = owner_of(request)   # the key's tenant (server/tenancy.py); None sees every stored response
    history = history_of(st, body, owner)
    turn = turn_of(body, history)
    asked, pre, hosted = await with_hosted(request, body, turn)  # a file_search runs here, before the model
    note_dropped(hosted.dropped, "/v1/responses")
    try:
        conv = await Conversation.start(st, asked, span_of(request))
    except InvalidRequest as err:
        if err.param and err.param.startswith("tools.") and ".function." in err.param:
            err.param = err.param.replace(".function.", ".")
        raise
    shape = Shape(body, conv.model, hosted.warnings())
    shape.pre = pre
    conv.headers.update(hosted.headers())
    if body.stream:
        return EventStream(_events(st, conv, shape, turn, owner), media_type="text/event-stream",
                           headers={**SSE_HEADERS, **conv.headers})
    [c] = await conv.choices(request)
    output = pre + output_of(c, namespaces_of(body.tools))
    resp = shape.response("incomplete" if c.finish_reason == "length" else "completed", output,
                          conv.usage([c.metrics]), c.finish_reason)
    if body.store:
        store_of(st).put(resp, history_after(shape.body, turn, output), owner)
    return JSONResponse(resp, headers=conv.headers)


async def _events(st: ServerState, conv: Conversation, shape: Shape, turn: ChatTurn,
                  owner: str | None = None) -> AsyncIterator[str]:
    seq = 0

    def event(kind: str, **data: Any) -> str:
        nonlocal seq
        seq += 1
        return sse_event(kind, {"type": kind, "sequence_number": seq - 1, **data})

    yield event("response.created", response=shape.response("in_progress", [], None))
    yield event("response.in_progress", response=shape.response("in_progress", [], None))
    for i, item in enumerate(shape.pre):  # a search that ran before generation
        for e in file_search_events(item, i, event):
            yield e
    output: list[dict[str, Any]] = list(shape.pre)
    text: dict[str, Any] | None = None  # the open message item
    calls: dict[int, dict[str, Any]] = {}

    def close_text() -> list[str]:
        nonlocal text
        if text is None:
            return []
        i, t = output.index(text), text["content"][0]["text"]
        done = message_item(t, mid=text["id"])
        output[i], text = done, None
        part = done["content"][0]
        return [event("response.output_text.done", item_id=done["id"], output_index=i, content_index=0,
                      text=t, logprobs=[]),
                event("response.content_part.done", item_id=done["id"], output_index=i, content_index=0, part=part),
                event("response.output_item.done", output_index=i, item=done)]

    thought: dict[str, Any] | None = None  # the open reasoning item

    def close_thought() -> list[str]:
        nonlocal thought
        if thought is None:
            return []
        i, done, thought = output.index(thought), thought, None
        done["status"] = "completed"
        return [event("response.reasoning_text.done", item_id=done["id"], output_index=i, content_index=0,
                      text=done["content"][0]["text"]),
                event("response.output_item.done", output_index=i, item=done)]

    try:
        async for ev in conv.events():
            if isinstance(ev, ReasoningDelta):
                if thought is None:
                    thought = reasoning_item("", status="in_progress")
                    output.append(thought)
                    yield event("response.output_item.added", output_index=len(output) - 1,
                                item={**thought, "content": []})
                thought["content"][0]["text"] += ev.text
                yield event("response.reasoning_text.delta", item_id=thought["id"], output_index=output.index(thought),
                            content_index=0, delta=ev.text)
                continue
            for e in close_thought():  # the answer begins: the reasoning is done
                yield e
            if isinstance(ev, TextDelta):
                if text is None:
                    text = message_item("", status="in_progress")
                    text["content"] = [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]
                    output.append(text)
                    i = len(output) - 1
                    yield event("response.output_item.added", output_index=i, item=message_item("", "in_progress",
                                                                                                  text["id"]))
                    yield event("response.content_part.added", item_id=text["id"], output_index=i, content_index=0,
                                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})
                text["content"][0]["text"] += ev.text
                yield event("response.output_text.delta", item_id=text["id"], output_index=output.index(text),
                            content_index=0, delta=ev.text, logprobs=[])
            elif isinstance(ev, CallStart):
                for e in close_text():
                    yield e
                item = call_item(ev.id, ev.name, "", status="in_progress",
                                 namespace=namespaces_of(shape.body.tools).get(ev.name))
                calls[ev.index] = item
                output.append(item)
                yield event("response.output_item.added", output_index=len(output) - 1, item=dict(item))
            elif isinstance(ev, CallArguments):
                item = calls[ev.index]
                item["arguments"] += ev.arguments
                yield event("response.function_call_arguments.delta", item_id=item["id"],
                            output_index=output.index(item), delta=ev.arguments)
            elif isinstance(ev, Finished):
                for e in close_text():
                    yield e
                for item in calls.values():
                    item["status"] = "completed"
                    i = output.index(item)
                    yield event("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                                name=item["name"], arguments=item["arguments"])
                    yield event("response.output_item.done", output_index=i, item=item)
                status = "incomplete" if ev.finish_reason == "length" else "completed"
                resp = shape.response(status, output, conv.usage([ev.metrics]), ev.finish_reason)
                if shape.body.store:
                    store_of(st).put(resp, history_after(shape.body, turn, output), owner)
                yield event(f"response.{status}", response=resp)
    except Exception as exc:  # noqa: BLE001 - once streaming has started the error goes in the stream
        err: OrtServeError = error_of(exc)
        yield event("error", code=err.code, message=err.message, param=err.param)


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> Any:
    found = store_of(state_of(request)).get(response_id, owner_of(request))
    if found is None:
        raise NotFound(f"no stored response {response_id!r}", param="response_id", code="response_not_found")
    return found[0]


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> Any:
    if not store_of(state_of(request)).delete(response_id, owner_of(request)):
        raise NotFound(f"no stored response {response_id!r}", param="response_id", code="response_not_found")
    return {"id": response_id, "object": "response", "deleted": True}
