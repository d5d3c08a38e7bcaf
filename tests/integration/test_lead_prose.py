r"""Prose before a tool call under ``tool_choice: auto`` ("Let me check." then the call), end to end.

No real small model reliably writes prose and then a call, so the test material is a real ONNX model
whose weights write a fixed text (tests/scripted.py) with the SmolLM2 tokenizer: "Let me check." and
then Hermes' ``<tool_call>\n``; the grammar forces the call that follows. Served on 127.0.0.1 and
read with the real openai and anthropic clients: Chat Completions, Responses and Messages each return
the prose and the call, streamed and not.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from openai import OpenAI
from scripted import build
from servers import ServerThread

PROSE = ["Let", " me", " check", "."]
OPENER = ["<", "tool", "_", "call", ">", "\n"]
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                         "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "What time is it?"}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer_dir: Path) -> Iterator[ServerThread]:
    model = build(tmp_path_factory.mktemp("scripted"), smollm2_tokenizer_dir, PROSE + OPENER)
    with ServerThread(model, model_id="scripted") as s:
        yield s


def test_the_scripted_model_writes_its_text(srv: ServerThread) -> None:
    """Without tools, its first ten tokens are the script."""
    client = OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)
    r = client.chat.completions.create(model="scripted", messages=ASK, max_tokens=10, temperature=0)  # type: ignore[arg-type]
    assert r.choices[0].message.content == "Let me check.<tool_call>\n"


@pytest.mark.parametrize("stream", [False, True])
def test_chat_completions_return_the_prose_and_the_call(srv: ServerThread, stream: bool) -> None:
    client = OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)
    kw = {"model": "scripted", "messages": ASK, "tools": [TIME], "max_tokens": 80, "temperature": 0}
    if not stream:
        r = client.chat.completions.create(**kw)  # type: ignore[call-overload]
        choice = r.choices[0]
        content, calls, finish = choice.message.content, choice.message.tool_calls, choice.finish_reason
        got = [(c.function.name, c.function.arguments) for c in calls or []]
    else:
        parts, args, names, finish = [], {}, {}, None
        for chunk in client.chat.completions.create(stream=True, **kw):  # type: ignore[call-overload]
            d = chunk.choices[0].delta
            parts.append(d.content or "")
            for c in d.tool_calls or []:
                names[c.index] = names.get(c.index) or (c.function.name if c.function else None)
                args[c.index] = args.get(c.index, "") + ((c.function.arguments or "") if c.function else "")
            finish = chunk.choices[0].finish_reason or finish
        content, got = "".join(parts), [(names[i], args[i]) for i in sorted(args)]
    assert content == "Let me check."
    assert got == [("get_time", "{}")] and finish == "tool_calls"  # the model's repeat of the call is dropped


def test_tool_choice_required_has_no_room_for_prose(srv: ServerThread) -> None:
    client = OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)
    r = client.chat.completions.create(model="scripted", messages=ASK, tools=[TIME],  # type: ignore[arg-type]
                                       tool_choice="required", max_tokens=80, temperature=0)
    msg = r.choices[0].message
    assert not msg.content and [c.function.name for c in msg.tool_calls or []] == ["get_time"]


def test_responses_output_a_message_then_the_call(srv: ServerThread) -> None:
    client = OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)
    tool = {"type": "function", "name": "get_time", "description": "The time now",
            "parameters": {"type": "object", "properties": {}}}
    r = client.responses.create(model="scripted", input="What time is it?", tools=[tool],  # type: ignore[list-item]
                                max_output_tokens=80, temperature=0)
    assert [o.type for o in r.output] == ["message", "function_call"]
    assert r.output_text == "Let me check."
    assert r.output[1].name == "get_time" and json.loads(r.output[1].arguments) == {}  # type: ignore[union-attr]
    with client.responses.stream(model="scripted", input="What time is it?", tools=[tool],  # type: ignore[list-item]
                                 max_output_tokens=80, temperature=0) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == "Let me check." and [o.type for o in final.output] == ["message", "function_call"]


@pytest.mark.parametrize("stream", [False, True])
def test_messages_return_a_text_block_then_tool_use(srv: ServerThread, stream: bool) -> None:
    claude = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0, timeout=120)
    kw = {"model": "scripted", "max_tokens": 80, "messages": ASK,  # its logits make sampling greedy
          "tools": [{"name": "get_time", "description": "The time now", "input_schema": {"type": "object"}}]}
    if stream:
        with claude.messages.stream(**kw) as s:  # type: ignore[arg-type]
            m = s.get_final_message()
    else:
        m = claude.messages.create(**kw)  # type: ignore[arg-type]
    assert [b.type for b in m.content] == ["text", "tool_use"] and m.stop_reason == "tool_use"
    assert m.content[0].text == "Let me check." and m.content[1].name == "get_time"  # type: ignore[union-attr]
