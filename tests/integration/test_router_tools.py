"""Tools, tool_choice, parallel_tool_calls and response_format through the router: the official
`openai` client against ortserve, which routes to real loopback servers speaking the OpenAI
and the Anthropic protocols (tests/router_fakes.py); the upstream bodies are asserted."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from pydantic import BaseModel
from router_fakes import FakeCloud
from servers import ServerThread

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
UNIT = {"type": "function", "function": {  # short arguments, so the random tiny model closes them
    "name": "set_unit", "parameters": {"type": "object", "properties": {"unit": {"enum": ["celsius", "kelvin"]}},
                                       "required": ["unit"], "additionalProperties": False}}}
ARGS = '{"city": "Paris, \\u00eele-de-France", "unit": "celsius"}'
HIGH = {"complexity": "high"}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class Answer(BaseModel):
    city: str
    degrees: int


@pytest.fixture(scope="module")
def fakes():
    a = FakeCloud("anthropic", reply="Hello from fake Anthropic").start()
    o = FakeCloud("openai", reply="Hello from fake OpenRouter").start()
    n = FakeCloud("openai", reply="I have no tools").start()
    yield a, o, n
    for f in (a, o, n):
        f.stop()


@pytest.fixture(scope="module")
def srv(tiny_model: Path, fakes: tuple[FakeCloud, FakeCloud, FakeCloud], tmp_path_factory: pytest.TempPathFactory):
    a, o, n = fakes
    home = tmp_path_factory.mktemp("route-tools")
    cfg = home / "route.json"
    cfg.write_text(json.dumps({
        "defaultProvider": "notools", "fallbackChain": ["notools", "anthropic", "openrouter", "local"],
        "cooldownSeconds": 0,
        "providers": {
            "local": {"type": "local"},
            "notools": {"type": "openai-compatible", "baseUrl": n.url, "apiKey": "sk-test-n", "tools": False,
                        "models": {"default": "plain-model"}},
            "anthropic": {"type": "anthropic", "baseUrl": a.url, "apiKey": "sk-ant-test",
                          "models": {"default": "claude-sonnet-4-5"}},
            "openrouter": {"type": "openai-compatible", "baseUrl": o.url, "apiKey": "sk-test-o",
                           "models": {"default": "openai/gpt-4o-mini"}}},
        "routing": {"rules": [{"condition": {"privacy": "high"}, "action": {"provider": "local"},
                               "reason": "private stays here"}]}}), encoding="utf-8")
    with ServerThread(tiny_model, router_config=str(cfg), home=str(home)) as s:
        yield s


@pytest.fixture()
def client(srv: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)


@pytest.fixture()
def clouds(fakes: tuple[FakeCloud, FakeCloud, FakeCloud]) -> tuple[FakeCloud, FakeCloud, FakeCloud]:
    for f in fakes:
        f.reset()
    return fakes


def test_openai_provider_gets_tools_unchanged_and_answers_tool_calls(client, clouds) -> None:
    _, o, _ = clouds
    o.calls.extend([("get_weather", ARGS), ("get_time", "{}")])
    r = client.chat.completions.with_raw_response.create(
        model="openrouter", messages=ASK, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=True,
        max_tokens=64)
    assert r.headers["x-ortserve-provider"] == "openrouter"
    assert o.body["tools"] == [WEATHER, TIME] and o.body["tool_choice"] == "required"
    assert o.body["parallel_tool_calls"] is True
    choice = r.parse().choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("call_0", "get_weather", ARGS), ("call_1", "get_time", "{}")]


def test_openai_provider_streams_argument_pieces_and_the_sdk_reassembles_them(client, clouds) -> None:
    _, o, _ = clouds
    o.calls.extend([("get_weather", ARGS), ("get_time", "{}")])
    named = {"type": "function", "function": {"name": "get_weather"}}
    pieces = 0
    with client.chat.completions.stream(model="openrouter", messages=ASK, tools=[WEATHER, TIME],
                                        tool_choice=named, max_tokens=64) as stream:
        for event in stream:
            pieces += event.type == "tool_calls.function.arguments.delta" and bool(event.arguments_delta)
        final = stream.get_final_completion()
    assert o.body["stream"] is True and o.body["tool_choice"] == named
    assert pieces == len(o.pieces(ARGS)) + 1  # each upstream piece went out as it came (get_time's "{}" too)
    calls = final.choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("call_0", "get_weather", ARGS), ("call_1", "get_time", "{}")]
    assert final.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(("choice", "parallel", "expected"), [
    ("auto", None, {"type": "auto"}),
    ("required", False, {"type": "any", "disable_parallel_tool_use": True}),
    ("none", None, {"type": "none"}),
    ({"type": "function", "function": {"name": "get_weather"}}, False,
     {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}),
    (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
])
def test_anthropic_gets_tools_and_tool_choice_in_its_shape(client, clouds, choice, parallel, expected) -> None:
    a, _, _ = clouds
    a.calls.append(("get_weather", ARGS))
    kw = {k: v for k, v in (("tool_choice", choice), ("parallel_tool_calls", parallel)) if v is not None}
    r = client.chat.completions.create(model="anthropic", messages=ASK, tools=[WEATHER, TIME], max_tokens=64, **kw)
    assert a.body["tools"] == [
        {"name": "get_weather", "description": "Weather for a city.", "input_schema": WEATHER["function"]["parameters"]},
        {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}]
    assert a.body["tool_choice"] == expected
    call = r.choices[0].message.tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("toolu_0", "get_weather",
                                                                                  json.loads(ARGS))
    assert r.choices[0].finish_reason == "tool_calls"


def test_anthropic_tool_use_streams_as_tool_call_deltas(client, clouds) -> None:
    a, _, _ = clouds
    a.calls.extend([("get_weather", ARGS), ("get_time", "{}")])
    pieces = 0
    with client.chat.completions.stream(model="anthropic", messages=ASK, tools=[WEATHER, TIME],
                                        max_tokens=64) as stream:
        for event in stream:
            pieces += event.type == "tool_calls.function.arguments.delta" and bool(event.arguments_delta)
        final = stream.get_final_completion()
    assert pieces == len(a.pieces(ARGS)) + 1
    calls = final.choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("toolu_0", "get_weather", ARGS), ("toolu_1", "get_time", "{}")]
    assert final.choices[0].finish_reason == "tool_calls"


def round_trip(client: openai.OpenAI, model: str) -> str | None:
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}},
        {"id": "call_8", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "18 degrees, sunny"},
        {"role": "tool", "tool_call_id": "call_8", "content": "14:05"},
        {"role": "user", "content": "Answer in one line."}]
    return client.chat.completions.create(model=model, messages=messages, tools=[WEATHER, TIME],
                                          max_tokens=64).choices[0].message.content


def test_tool_round_trip_reaches_each_provider_in_its_own_shape(client, clouds) -> None:
    a, o, _ = clouds
    assert round_trip(client, "anthropic") == "Hello from fake Anthropic"
    assert a.body["messages"] == [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "call_7", "name": "get_weather", "input": json.loads(ARGS)},
            {"type": "tool_use", "id": "call_8", "name": "get_time", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_7", "content": "18 degrees, sunny"},
            {"type": "tool_result", "tool_use_id": "call_8", "content": "14:05"},
            {"type": "text", "text": "Answer in one line."}]}]
    assert round_trip(client, "openrouter") == "Hello from fake OpenRouter"
    assert o.body["messages"][1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}},
        {"id": "call_8", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
    assert o.body["messages"][2] == {"role": "tool", "tool_call_id": "call_7", "content": "18 degrees, sunny"}


def test_response_format_through_anthropic_is_a_forced_tool(client, clouds) -> None:
    a, _, _ = clouds
    a.calls.append(("unused", '{"city": "Paris", "degrees": 18}'))
    parsed = client.chat.completions.parse(model="anthropic", messages=ASK, response_format=Answer, max_tokens=64)
    assert parsed.choices[0].message.parsed == Answer(city="Paris", degrees=18)
    assert parsed.choices[0].finish_reason == "stop"
    forced = a.body["tools"][-1]
    assert a.body["tool_choice"] == {"type": "tool", "name": "Answer"}
    assert forced["name"] == "Answer" and forced["input_schema"]["required"] == ["city", "degrees"]
    with client.chat.completions.stream(model="anthropic", messages=ASK, response_format={"type": "json_object"},
                                        max_tokens=64) as stream:
        text = "".join(e.delta for e in stream if e.type == "content.delta")
    assert json.loads(text) == {"city": "Paris", "degrees": 18}
    assert a.body["tools"] == [{"name": "json_output", "description": "Give the answer as a JSON object.",
                                "input_schema": {"type": "object"}}]


def test_response_format_passes_unchanged_to_openai_compatible(client, clouds) -> None:
    _, o, _ = clouds
    o.reply = '{"city": "Paris", "degrees": 18}'
    try:
        parsed = client.chat.completions.parse(model="openrouter", messages=ASK, response_format=Answer,
                                               max_tokens=64)
    finally:
        o.reply = "Hello from fake OpenRouter"
    assert parsed.choices[0].message.parsed == Answer(city="Paris", degrees=18)
    rf = o.body["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["name"] == "Answer" and rf["json_schema"]["strict"]


def test_tools_skip_a_provider_that_has_none(srv: ServerThread, client, clouds) -> None:
    a, _, n = clouds
    a.calls.append(("get_weather", ARGS))
    r = client.chat.completions.with_raw_response.create(model="auto", messages=ASK, tools=[WEATHER], metadata=HIGH,
                                                         max_tokens=64)
    assert r.headers["x-ortserve-provider"] == "anthropic" and n.requests == []
    assert "cannot take 'tools'" in r.headers["x-ortserve-route-reason"]
    plain = client.chat.completions.with_raw_response.create(model="auto", messages=ASK, metadata=HIGH, max_tokens=8)
    assert plain.headers["x-ortserve-provider"] == "notools"
    bad = httpx.post(f"{srv.url}/v1/chat/completions", timeout=30, json={
        "model": "notools", "messages": ASK, "tools": [WEATHER], "tool_choice": "none"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tools", bad.text
    history = [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    bad = httpx.post(f"{srv.url}/v1/chat/completions", timeout=30, json={"model": "notools", "messages": history})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages", bad.text
    bad = httpx.post(f"{srv.url}/v1/chat/completions", timeout=30, json={
        "model": "notools", "messages": ASK, "response_format": {"type": "json_object"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format", bad.text
    assert n.requests[-1]["body"]["messages"] == ASK  # only the plain request above reached it


def test_private_tool_request_stays_local_and_the_engine_calls_the_tool(client, clouds) -> None:
    a, o, n = clouds
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.with_raw_response.create(
        model="auto", messages=ASK, tools=[WEATHER, TIME], tool_choice=named, metadata={"privacy": "high"},
        max_tokens=64, temperature=0)
    assert r.headers["x-ortserve-provider"] == "local"
    choice = r.parse().choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "get_time"
    assert isinstance(json.loads(choice.message.tool_calls[0].function.arguments), dict)  # the grammar holds
    assert a.requests == o.requests == n.requests == []


def test_private_tool_request_streams_from_the_local_engine(client, clouds) -> None:
    with client.chat.completions.stream(model="auto", messages=ASK, tools=[UNIT], tool_choice="required",
                                        metadata={"privacy": "high"}, max_tokens=64, temperature=0) as stream:
        pieces = sum(e.type == "tool_calls.function.arguments.delta" and bool(e.arguments_delta) for e in stream)
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls" and calls[0].function.name == "set_unit"
    assert json.loads(calls[0].function.arguments)["unit"] in ("celsius", "kelvin")
    assert pieces > 1  # the arguments streamed as generated
    assert all(not f.requests for f in clouds)


def test_logprobs_come_back_from_an_openai_compatible_provider_and_the_local_engine(srv, client, clouds) -> None:
    a, o, _ = clouds
    r = client.chat.completions.create(model="openrouter", messages=ASK, logprobs=True, top_logprobs=2, max_tokens=8)
    assert (o.body["logprobs"], o.body["top_logprobs"]) == (True, 2)
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content and len(content[0].top_logprobs) == 2
    stream = client.chat.completions.create(model="openrouter", messages=ASK, logprobs=True, max_tokens=8, stream=True)
    tokens = [t.token for c in stream if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert "".join(tokens) == "Hello from fake OpenRouter" and "top_logprobs" not in o.body
    local = client.chat.completions.create(model="auto", messages=ASK, logprobs=True, top_logprobs=1, max_tokens=6,
                                           metadata={"privacy": "high"})
    assert len(local.choices[0].logprobs.content) == local.usage.completion_tokens
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 1 for t in local.choices[0].logprobs.content)
    bad = httpx.post(f"{srv.url}/v1/chat/completions", timeout=30, json={
        "model": "anthropic", "messages": ASK, "logprobs": True})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "logprobs", bad.text
    assert a.requests == []
