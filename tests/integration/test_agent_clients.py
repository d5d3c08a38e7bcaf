"""Today's agent clients against a live server on the real default model: the openai SDK's
Responses API (create, stream, parse), the OpenAI Agents SDK with its default Responses model,
and the anthropic SDK's Messages API (tools, streamed and not). One server for the module."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from openai import BadRequestError, NotFoundError, OpenAI
from pydantic import BaseModel
from servers import ServerThread

pytestmark = pytest.mark.default_model

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                  "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": WEATHER_PARAMS, "strict": True}
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def srv(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(default_model, home=tmp_path_factory.mktemp("home")) as s:
        yield s


@pytest.fixture(scope="module")
def oai(srv: ServerThread) -> OpenAI:
    return OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(srv: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0, timeout=120)


def test_responses_text(oai: OpenAI) -> None:
    r = oai.responses.create(model="default", input="Say hello.", instructions="Be brief.",
                             max_output_tokens=16, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text.strip() and r.output[0].type == "message"
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 16
    assert r.usage.input_tokens_details.cached_tokens >= 0
    assert r.status in ("completed", "incomplete")
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def test_responses_tool_loop_with_previous_response_id(oai: OpenAI) -> None:
    first = oai.responses.create(model="default", input=ASK, tools=[WEATHER], tool_choice="required",
                                 max_output_tokens=64, temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_PARAMS)
    second = oai.responses.create(model="default", previous_response_id=first.id, tools=[WEATHER],
                                  tool_choice="none", max_output_tokens=32, temperature=0,
                                  input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                          "output": "Sunny, 21 C"}])
    assert second.previous_response_id == first.id and second.output_text.strip()
    # the second turn's prompt holds the stored first turn (question and call), not only the tool output
    alone = oai.responses.create(model="default", input="Sunny, 21 C", max_output_tokens=1)
    assert second.usage.input_tokens > alone.usage.input_tokens + 10
    got = oai.responses.retrieve(second.id)
    assert got.id == second.id and got.output_text == second.output_text
    oai.responses.delete(first.id)
    with pytest.raises(NotFoundError):
        oai.responses.retrieve(first.id)


def test_responses_stream_events(oai: OpenAI) -> None:
    kinds, text = [], ""
    with oai.responses.stream(model="default", input=ASK, tools=[WEATHER], tool_choice="required",
                              max_output_tokens=64, temperature=0) as s:
        for ev in s:
            kinds.append(ev.type)
        final = s.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_item.added" in kinds and "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds and "response.output_item.done" in kinds
    call = next(o for o in final.output if o.type == "function_call")
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMS)
    last = None
    with oai.responses.create(model="default", input="Tell me about Paris.", max_output_tokens=12, stream=True) as s:
        for ev in s:
            if ev.type == "response.output_text.delta":
                text += ev.delta
            last = ev
    # cut at max_output_tokens: the stream ends with response.incomplete, as OpenAI's does
    assert last.type == "response.incomplete" and last.response.incomplete_details.reason == "max_output_tokens"
    assert text and last.response.output_text == text


class City(BaseModel):
    name: str
    country: str


def test_responses_parse(oai: OpenAI) -> None:
    r = oai.responses.parse(model="default", input="Name a city in France.", text_format=City,
                            max_output_tokens=48, temperature=0)
    assert isinstance(r.output_parsed, City)


def test_responses_bad_input(oai: OpenAI) -> None:
    with pytest.raises(BadRequestError) as e:
        oai.responses.create(model="default", input="hi", tools=[{"type": "local_shell"}])  # hosted web_search: test_hosted_tools.py
    assert e.value.body["param"] == "tools.0.type"
    with pytest.raises(BadRequestError) as e:
        oai.responses.create(model="default", input="hi", extra_body={"frobnicate": 1})
    assert e.value.body["param"] == "frobnicate"
    with pytest.raises(BadRequestError) as e:
        oai.responses.create(model="default", input="hi", max_output_tokens=10**9)
    assert e.value.body["param"] == "max_output_tokens"
    with pytest.raises(NotFoundError) as nf:
        oai.responses.create(model="default", input="hi", previous_response_id="resp_nope")
    assert nf.value.body["param"] == "previous_response_id"
    with pytest.raises(BadRequestError) as e:
        oai.responses.create(model="default", input=[{"type": "input_image", "image_url": "x"}])
    assert e.value.body["param"] == "input.0.type"


def test_responses_survive_a_restart(default_model: Path, tmp_path: Path) -> None:
    with ServerThread(default_model, home=tmp_path) as s:
        c = OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=120)
        rid = c.responses.create(model="default", input="Say hi.", max_output_tokens=8).id
    with ServerThread(default_model, home=tmp_path) as s:
        c = OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=120)
        assert c.responses.retrieve(rid).id == rid
        follow = c.responses.create(model="default", input="Again.", previous_response_id=rid, max_output_tokens=8)
        assert follow.previous_response_id == rid


def test_agents_sdk_default_model_runs_a_tool_loop(srv: ServerThread) -> None:
    import asyncio

    from agents import (
        Agent,
        ModelSettings,
        Runner,
        function_tool,
        set_default_openai_client,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    called: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        called.append(f"weather:{city}")
        return f"Sunny, 21 C in {city}"

    @function_tool
    def get_time(tz: str) -> str:
        """Current time in a timezone."""
        called.append(f"time:{tz}")
        return "12:00"

    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0),
                              use_for_tracing=False)
    agent = Agent(name="weather", instructions="Use the tools, then answer in one sentence.",
                  tools=[get_weather, get_time], model="default",
                  model_settings=ModelSettings(tool_choice="required", max_tokens=48, temperature=0))
    result = asyncio.run(Runner.run(agent, ASK, max_turns=4))
    assert called and called[0].startswith(("weather:", "time:"))
    assert isinstance(result.final_output, str) and result.final_output.strip()


def test_messages_text_and_stop_sequence(claude: anthropic.Anthropic) -> None:
    m = claude.messages.create(model="default", max_tokens=16, system="Be brief.",
                               messages=[{"role": "user", "content": "Say hello."}], extra_body={"temperature": 0})
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens > 0
    first = m.content[0].text.split()[0]
    cut = claude.messages.create(model="default", max_tokens=16, system="Be brief.", extra_body={"temperature": 0},
                                 messages=[{"role": "user", "content": "Say hello."}], stop_sequences=[first])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == first


@pytest.mark.parametrize("stream", [False, True])
def test_messages_tool_loop(claude: anthropic.Anthropic, stream: bool) -> None:
    tool = {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER_PARAMS}
    kw: dict[str, Any] = {"model": "default", "max_tokens": 64, "tools": [tool],  
                          "tool_choice": {"type": "any"}, "messages": [{"role": "user", "content": ASK}]}
    if stream:
        with claude.messages.stream(**kw) as s:
            kinds = [ev.type for ev in s]
            m = s.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        assert "content_block_start" in kinds and "content_block_stop" in kinds
    else:
        m = claude.messages.create(**kw)
    use = next(b for b in m.content if b.type == "tool_use")
    assert m.stop_reason == "tool_use" and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER_PARAMS)
    answer = claude.messages.create(**{**kw, "tool_choice": {"type": "none"}, "max_tokens": 24, "messages": [
        {"role": "user", "content": ASK}, {"role": "assistant", "content": m.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}]}]})
    assert answer.content[0].type == "text" and answer.content[0].text.strip()
    n = claude.messages.count_tokens(model="default", tools=[tool], messages=kw["messages"])
    assert 0 < n.input_tokens < m.usage.input_tokens + m.usage.cache_read_input_tokens + 1


def test_messages_errors_in_anthropic_shape(srv: ServerThread, claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="default", max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": ""}}]}])
    # an image for a text-only model: named by its field (docs/vision.md)
    assert e.value.body["type"] == "error" and "messages.0.content.0.source.data" in e.value.body["error"]["message"]
    r = httpx.post(f"{srv.url}/v1/messages?beta=true", json={"model": "default", "messages": []})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{srv.url}/v1/messages", json={"model": "nope-model", "max_tokens": 4,
                                                   "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_claude_code_request_shape(srv: ServerThread) -> None:
    """The fields Claude Code 2.1 sends on every turn (captured from `claude -p`), each honoured."""
    body = {"model": "default", "max_tokens": 32000, "stream": False, "metadata": {"user_id": "{\"device_id\":\"x\"}"},
            "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
                         {"role": "system", "content": "Answer in English."}]}
    r = httpx.post(f"{srv.url}/v1/messages?beta=true", json=body, headers={"x-api-key": "none"}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["text"].strip()
    bad = httpx.post(f"{srv.url}/v1/messages", json={**body, "thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert bad.status_code == 400 and "thinking.type" in bad.json()["error"]["message"]
    bad = httpx.post(f"{srv.url}/v1/messages", json={**body, "context_management": {"edits": [
        {"type": "clear_tool_uses_20250919"}]}})
    assert bad.status_code == 400 and "context_management.edits.0.type" in bad.json()["error"]["message"]


def test_messages_structured_output(claude: anthropic.Anthropic) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
              "additionalProperties": False}
    m = claude.messages.create(model="default", max_tokens=40, messages=[{"role": "user", "content": "A city?"}],
                               extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}}})
    jsonschema.validate(json.loads(m.content[0].text), schema)


def test_codex_request_shape(oai: OpenAI) -> None:
    """The fields Codex CLI 0.169 sends (captured from `codex exec`): namespaced tools, client_metadata,
    reasoning, include reasoning.encrypted_content, store false, developer messages as content parts."""
    ns = {"type": "namespace", "name": "weather_v1", "description": "Weather tools",
          "tools": [{k: v for k, v in WEATHER.items() if k != "strict"}]}
    r = oai.responses.create(model="default", tools=[ns], tool_choice="required", max_output_tokens=64,
                             parallel_tool_calls=True, reasoning={"summary": "auto"}, store=False,
                             include=["reasoning.encrypted_content"], prompt_cache_key="thread-1",
                             extra_body={"client_metadata": {"thread_id": "t"}},
                             input=[{"type": "message", "role": "developer",
                                     "content": [{"type": "input_text", "text": "You call tools."}]},
                                    {"type": "message", "role": "user",
                                     "content": [{"type": "input_text", "text": ASK}]}])
    call = next(o for o in r.output if o.type == "function_call")
    assert call.name == "get_weather" and getattr(call, "namespace", None) == "weather_v1"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMS)
    with pytest.raises(NotFoundError):
        oai.responses.retrieve(r.id)  # store: false keeps nothing
