"""Ollama's generation API: POST /api/chat, /api/generate, /api/embed and /api/embeddings.

What Open WebUI, Zed, Cline, Goose and every "Ollama" provider speak, over the same shared layer as
the OpenAI and Anthropic adapters: a request becomes the internal chat turn (server/conversation.py)
and its events come back as Ollama's NDJSON lines (streamed by default, as Ollama does) or one JSON
object with ``stream: false``. Tool calls come back whole, with their arguments as an object, as
Ollama sends them. Errors are ``{"error": "..."}`` (server/app.py picks the shape by path). The model
routes (tags, show, ps, copy, delete, pull, create, version) are in ollama_models.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ortserve.errors import InvalidRequest, NotFound
from ortserve.server.api.embeddings import MAX_INPUTS, embed_inputs
from ortserve.server.api.ollama_wire import (
    NAMES,
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    JSONBody,
    Options,
    _Generating,
    durations,
    model_ref,
    now_iso,
)
from ortserve.server.conversation import (
    CallArguments,
    CallStart,
    ChatTurn,
    Conversation,
    Finished,
    ReasoningDelta,
    TextDelta,
    count_prompt,
    error_of,
)
from ortserve.server.sse import EventStream
from ortserve.server.state import ServerState, state_of
from ortserve.telemetry import span_of

router = APIRouter(route_class=JSONBody)
NDJSON = "application/x-ndjson"
# text, thinking, tool calls -> the fields of one line (chat: a message; generate: response/thinking)
Shape = Callable[[str, str | None, list[dict[str, Any]] | None], dict[str, Any]]


def chat_shape(text: str, thinking: str | None, calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = calls
    return {"message": message}


def generate_shape(text: str, thinking: str | None, calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"response": text, **({"thinking": thinking} if thinking else {})}


def tool_calls(calls: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """Finished calls (id, name, JSON arguments) in Ollama's shape: arguments as an object."""
    out = []
    for i, (cid, name, arguments) in enumerate(calls):
        try:
            args = json.loads(arguments or "{}")
        except ValueError:
            continue  # never closed (cut by the token limit): dropped, as the other APIs drop it
        out.append({"id": cid, "function": {"index": i, "name": name, "arguments": args}})
    return out


def done_reason(finish: str) -> str:
    return "length" if finish == "length" else "stop"


def turn_of(body: _Generating, messages: list[dict[str, Any]], cap: int,
            tools: list[dict[str, Any]] | None = None, tool_choice: Any = None) -> ChatTurn:
    """The wire request as the internal one. Unset num_predict means until the model stops, as in
    Ollama: the server's cap, cut to the room left in the context."""
    options = body.options or Options()
    return ChatTurn(messages=messages, model=model_ref(body.model), sampling=options.sampling(),
                    max_tokens=body.max_tokens(cap), max_tokens_is_ceiling=True, tools=tools or None,
                    tool_choice=tool_choice if tools else None,
                    response_format=body.response_format(), keep_alive=body.keep_alive,
                    thinking=body.thinking(), thinking_param="think" if body.think is False else None,
                    reasoning_budget=body.reasoning_budget(), names=NAMES)


async def start(st: ServerState, body: _Generating, turn: ChatTurn, request: Request) -> Conversation:
    """``think`` on a model that does not reason is a 400 (as Ollama's); ``num_ctx`` bounds prompt and
    answer within the model's context (it cannot grow it: the KV cache is sized when the model loads)."""
    num_ctx = body.options.num_ctx if body.options else None
    vision = getattr(st, "vision", None)
    if (body.think not in (None, False) or num_ctx) and vision is not None and vision.variant(turn.model):
        field = "options.num_ctx" if num_ctx else "think"   # the image path has no prompt count or reasoning yet
        raise InvalidRequest(f"'{field}' is not served with vision models yet (docs/vision.md)", param=field)
    if body.think not in (None, False) or num_ctx:
        engine = await st.engine_for(turn.model, turn.keep_alive)
        if body.think not in (None, False) and not engine.codec.thinks:
            raise InvalidRequest(f"'{body.model}' does not support thinking", param="think")
        if num_ctx:
            turn.max_tokens = await _room(st, engine, turn, num_ctx, min(turn.max_tokens or st.settings.max_tokens_cap,
                                                                         st.settings.max_tokens_cap))
    return await Conversation.start(st, turn, span_of(request))


async def _room(st: ServerState, engine: Any, turn: ChatTurn, num_ctx: int, wanted: int) -> int:
    if num_ctx > engine.context_length:
        raise InvalidRequest(f"'options.num_ctx' is {num_ctx}, above {engine.model_id}'s context of "
                             f"{engine.context_length} tokens (fixed when it loads)", param="options.num_ctx")
    prompt = len(turn.prompt_ids(engine)) if turn.prompt_ids else await count_prompt(st, turn)
    if prompt >= num_ctx:
        raise InvalidRequest(f"the prompt is {prompt} tokens, which leaves no room in 'options.num_ctx' "
                             f"{num_ctx} (it is never cut silently)", param="options.num_ctx")
    return min(wanted, num_ctx - prompt)


async def load_only(st: ServerState, body: _Generating, shape: Shape) -> JSONResponse:
    """An empty prompt loads the model (done_reason "load"); with keep_alive 0 it unloads it."""
    reason = "load"
    if body.keep_alive == 0:
        reason = "unload"
        try:
            await st.manager.unload(model_ref(body.model))  # type: ignore[union-attr]
        except NotFound as exc:
            if exc.code != "model_not_loaded":
                raise
    else:
        await st.engine_for(model_ref(body.model), body.keep_alive)
    return JSONResponse({"model": body.model, "created_at": now_iso(), **shape("", None, None), "done": True,
                         "done_reason": reason})


async def answer(conv: Conversation, body: _Generating, shape: Shape, request: Request) -> Any:
    if body.stream:
        return EventStream(lines(conv, body.model, shape), media_type=NDJSON, headers=conv.headers)
    [c] = await conv.choices(request)
    calls = tool_calls([(t.id, t.name, t.arguments) for t in c.tool_calls])
    return JSONResponse({"model": body.model, "created_at": now_iso(), **shape(c.text, c.reasoning, calls),
                         "done": True, "done_reason": done_reason(c.finish_reason),
                         **durations(c.metrics, conv.prompt_tokens)}, headers=conv.headers)


def line(data: dict[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n"


async def lines(conv: Conversation, model: str, shape: Shape) -> AsyncIterator[str]:
    """The events as NDJSON: text and thinking as they come, tool calls whole, then the done line."""
    calls: dict[int, list[str]] = {}
    try:
        async for ev in conv.events():
            head = {"model": model, "created_at": now_iso()}
            if isinstance(ev, ReasoningDelta):
                yield line({**head, **shape("", ev.text, None), "done": False})
            elif isinstance(ev, TextDelta):
                yield line({**head, **shape(ev.text, None, None), "done": False})
            elif isinstance(ev, CallStart):
                calls[ev.index] = [ev.id, ev.name, ""]
            elif isinstance(ev, CallArguments):
                calls[ev.index][2] += ev.arguments
            elif isinstance(ev, Finished):
                if calls:
                    done = tool_calls([(c[0], c[1], c[2]) for _, c in sorted(calls.items())])
                    yield line({**head, **shape("", None, done), "done": False})
                yield line({**head, **shape("", None, None), "done": True, "done_reason": done_reason(ev.finish_reason),
                            **durations(ev.metrics, conv.prompt_tokens)})
    except Exception as exc:  # noqa: BLE001 - once streaming has started the error goes in the stream
        yield line({"error": error_of(exc).message})


@router.post("/api/chat", response_model=None)
async def chat(body: ChatRequest, request: Request) -> Any:
    st = state_of(request)
    st.ready_engine()
    if not body.messages:
        return await load_only(st, body, chat_shape)
    if body.tool_choice is not None and not body.tools:
        raise InvalidRequest("'tool_choice' needs 'tools'", param="tool_choice")
    turn = turn_of(body, body.plain_messages(), st.settings.max_tokens_cap, body.tools, body.tool_choice)
    return await answer(await start(st, body, turn, request), body, chat_shape, request)


@router.post("/api/generate", response_model=None)
async def generate(body: GenerateRequest, request: Request) -> Any:
    st = state_of(request)
    st.ready_engine()
    if not body.prompt and not body.suffix:
        return await load_only(st, body, generate_shape)
    turn = turn_of(body, body.plain_messages(), st.settings.max_tokens_cap)
    turn.prompt_ids = body.prompt_ids()
    return await answer(await start(st, body, turn, request), body, generate_shape, request)


def _no_options(options: Options | None) -> None:
    given = sorted(options.model_dump(exclude_none=True) if options else {})
    if given:
        raise InvalidRequest(f"'options.{given[0]}' does not apply to embeddings", param=f"options.{given[0]}")


def _keep_alive(st: ServerState, model_id: str, keep_alive: float | None) -> None:
    """An embedding model's keep_alive, on its manager slot (the holder loads it, the manager unloads it)."""
    slot = st.manager.slots.get(model_id) if st.manager is not None else None
    if slot is not None and keep_alive is not None and not slot.pinned:
        slot.keep_alive = keep_alive


async def _embed(st: ServerState, model: str, texts: list[str], truncate: bool, dimensions: int | None,
                 keep_alive: float | None) -> tuple[Any, float]:
    for i, t in enumerate(texts):
        if not t.strip():
            raise InvalidRequest(f"'input.{i}' is empty", param=f"input.{i}")
    if not texts or len(texts) > MAX_INPUTS:
        raise InvalidRequest(f"'input' must hold 1 to {MAX_INPUTS} texts, got {len(texts)}", param="input")
    t0 = time.monotonic()
    variant, out = await embed_inputs(st, model_ref(model), lambda e: e.tokenize(texts), dimensions, truncate)
    _keep_alive(st, variant.id, keep_alive)
    return out, time.monotonic() - t0


@router.post("/api/embed")
async def embed(body: EmbedRequest, request: Request) -> dict[str, Any]:
    _no_options(body.options)
    texts = [body.input] if isinstance(body.input, str) else list(body.input)
    out, took = await _embed(state_of(request), body.model, texts, body.truncate, body.dimensions,
                             body.keep_alive)  # type: ignore[arg-type]
    return {"model": body.model, "embeddings": out.vectors.tolist(), "total_duration": int(took * 1e9),
            "load_duration": 0, "prompt_eval_count": out.prompt_tokens}


@router.post("/api/embeddings")
async def embeddings(body: EmbeddingsRequest, request: Request) -> dict[str, Any]:
    """The older single-text form: one ``prompt`` in, one ``embedding`` out."""
    _no_options(body.options)
    out, _ = await _embed(state_of(request), body.model, [body.prompt], True, None,
                          body.keep_alive)  # type: ignore[arg-type]
    return {"embedding": out.vectors[0].tolist()}
