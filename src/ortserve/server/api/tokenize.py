"""Token counts and ids: llama-server's POST /tokenize and /detokenize, and OpenAI's
POST /v1/responses/input_tokens.

``/tokenize`` takes llama-server's ``content`` (``add_special``, ``parse_special``, ``with_pieces``)
or vLLM's ``messages`` (the conversation rendered with the model's chat template, as a chat request
submits it). Every chat-shaped count goes through one function (``TextCodec.chat_ids``, via
``conversation.count_prompt``), so /tokenize's ``messages``, /v1/responses/input_tokens and
/v1/messages/count_tokens agree with each other and with the usage of the request itself.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import ConfigDict, Field, StrictBool, StrictInt

from ortserve.errors import InvalidRequest
from ortserve.server.api.openai_responses import ResponsesRequest, _check_model, history_of, turn_of
from ortserve.server.api.responses_hosted import with_hosted
from ortserve.server.conversation import count_prompt
from ortserve.server.protocol import Message, _Contract
from ortserve.server.state import state_of
from ortserve.server.tenancy import owner_of

router = APIRouter()


class TokenizeRequest(_Contract):
    # published: 'content' or 'messages', one of them (the route's 400 says so)
    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": ["content"], "properties": {"content": {"type": "string"}, "messages": {"type": "null"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}, "content": {"type": "null"}}}]})
    model: str | None = None
    content: str | None = None
    messages: list[Message] | None = Field(None, min_length=1)  # vLLM's chat form
    add_special: StrictBool = False    # llama-server's default: no BOS/EOS added
    parse_special: StrictBool = True   # special tokens' text becomes those tokens
    with_pieces: StrictBool = False    # [{id, piece}] instead of ids
    add_generation_prompt: StrictBool = True  # with messages: end with the assistant's turn opening


class DetokenizeRequest(_Contract):
    model: str | None = None
    tokens: list[StrictInt]


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> Any:
    st = state_of(request)
    engine = await st.engine_for(body.model)
    codec = engine.codec
    if (body.content is None) == (body.messages is None):
        raise InvalidRequest("give 'content' (text) or 'messages' (a conversation), one of them", param="content")
    if body.messages is not None:
        messages = [m.plain() for m in body.messages]
        ids = codec.chat_ids(messages) if body.add_generation_prompt else codec.encode(
            codec.render_chat(messages, add_generation_prompt=False), add_special_tokens=False)
    elif body.parse_special:
        ids = codec.encode(body.content or "", add_special_tokens=body.add_special)
    else:
        ids = codec.text_ids(body.content or "", add_special=body.add_special)
    tokens: list[Any] = [{"id": i, "piece": codec.piece(i)} for i in ids] if body.with_pieces else ids
    return {"tokens": tokens, "count": len(ids), "max_model_len": engine.context_length}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> Any:
    engine = await state_of(request).engine_for(body.model)
    vocab = engine.core.runner.spec.vocab_size
    for i, t in enumerate(body.tokens):
        if not 0 <= t < vocab:
            raise InvalidRequest(f"'tokens.{i}' is {t}; this model's token ids are 0..{vocab - 1}",
                                 param=f"tokens.{i}")
    # special tokens come back as their text, as llama-server's does: detokenize(tokenize(x)) == x
    return {"content": engine.codec.tokenizer.decode(body.tokens, skip_special_tokens=False)}


@router.post("/v1/responses/input_tokens")
async def input_tokens(body: ResponsesRequest, request: Request) -> Any:
    st = state_of(request)
    st.ready_engine()
    _check_model(st, body.model)
    turn = turn_of(body, history_of(st, body, owner_of(request)))   # another key's response: a 404
    asked, _, _ = await with_hosted(request, body, turn)  # a file_search's results are part of the prompt
    try:
        n = await count_prompt(st, asked)
    except InvalidRequest as err:
        if err.param and err.param.startswith("tools.") and ".function." in err.param:
            err.param = err.param.replace(".function.", ".")
        raise
    return {"object": "response.input_tokens", "input_tokens": n}
