"""Tool calling and structured output through the official openai client, on the real
default model (SmolLM2-135M-Instruct), one server for the module."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from openai import BadRequestError, LengthFinishReasonError, OpenAI
from pydantic import BaseModel
from servers import ServerThread

pytestmark = pytest.mark.default_model

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 30}},
                   "required": ["tz"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris, and what time is it in Tokyo?"}]


@pytest.fixture(scope="module")
def client(default_model: Path) -> Iterator[OpenAI]:
    with ServerThread(default_model) as srv:
        yield OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)


def _check_call(call, tools=(WEATHER, TIME)) -> dict:
    spec = next(t["function"] for t in tools if t["function"]["name"] == call.function.name)
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, spec["parameters"])
    assert call.id.startswith("call_") and call.type == "function"
    return args


def _stream(client: OpenAI, **kw):
    """Stream with the openai helper and return (final completion, chunks)."""
    chunks = []
    with client.chat.completions.stream(model="default", **kw) as s:
        try:
            for ev in s:
                if ev.type == "chunk":
                    chunks.append(ev.chunk)
            final = s.get_final_completion()
        except LengthFinishReasonError:  # prose cut at max_tokens: the helper refuses to "parse" it
            final = s.current_completion_snapshot
    return final, chunks


@pytest.mark.parametrize("stream", [False, True])
def test_required_forces_a_valid_call(client: OpenAI, stream: bool) -> None:
    kw = {"messages": ASK, "tools": [WEATHER, TIME], "tool_choice": "required", "temperature": 0, "max_tokens": 60,
          "parallel_tool_calls": False}  # parallel calls: test_parallel_calls_stream_in_order
    if stream:
        r, chunks = _stream(client, **kw)
        arg_deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or []) if c.choices]
        firsts = [d for d in arg_deltas if d.id]
        assert all(d.function.name for d in firsts) and len(firsts) == len(r.choices[0].message.tool_calls)
        # arguments arrive in several pieces, as generated, not as one final blob
        assert sum(1 for d in arg_deltas if d.function and d.function.arguments) > len(firsts)
    else:
        r = client.chat.completions.create(model="default", **kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls
    for call in msg.tool_calls:
        _check_call(call)
    assert len({c.id for c in msg.tool_calls}) == len(msg.tool_calls)


@pytest.mark.parametrize("stream", [False, True])
def test_named_choice_calls_that_tool(client: OpenAI, stream: bool) -> None:
    kw = {"messages": ASK, "tools": [WEATHER, TIME], "temperature": 0, "max_tokens": 80,
              "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    r = _stream(client, **kw)[0] if stream else client.chat.completions.create(model="default", **kw)
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"]
    _check_call(calls[0])


@pytest.mark.parametrize("stream", [False, True])
def test_none_answers_in_prose(client: OpenAI, stream: bool) -> None:
    kw = {"messages": ASK, "tools": [WEATHER], "tool_choice": "none", "temperature": 0, "max_tokens": 20}
    r = _stream(client, **kw)[0] if stream else client.chat.completions.create(model="default", **kw)
    assert not r.choices[0].message.tool_calls and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("stream", [False, True])
def test_auto_is_text_or_valid_calls(client: OpenAI, stream: bool) -> None:
    for messages in (ASK, [{"role": "user", "content": "Say hello."}]):
        kw = {"messages": messages, "tools": [WEATHER, TIME], "temperature": 0, "max_tokens": 60,
              "parallel_tool_calls": False}
        r = _stream(client, **kw)[0] if stream else client.chat.completions.create(model="default", **kw)
        msg = r.choices[0].message
        if msg.tool_calls:
            assert r.choices[0].finish_reason == "tool_calls"
            for call in msg.tool_calls:
                _check_call(call)
        else:
            assert msg.content and not msg.content.startswith("<tool_call>")


def test_parallel_false_gives_one_call(client: OpenAI) -> None:
    r = client.chat.completions.create(model="default", messages=ASK, tools=[WEATHER, TIME], max_tokens=120,
                                       tool_choice="required", parallel_tool_calls=False, temperature=0)
    assert len(r.choices[0].message.tool_calls) == 1


def test_parallel_calls_stream_in_order(client: OpenAI) -> None:
    # a prompt that already shows two calls: the model continues with several, each indexed
    msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather",
                                                           "arguments": '{"city": "Paris", "unit": "celsius"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "Asia/Tokyo"}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_b", "content": "21:04"}, ASK[0]]
    r, chunks = _stream(client, messages=msgs, tools=[WEATHER, TIME], tool_choice="required",
                        temperature=0, max_tokens=200)
    calls = r.choices[0].message.tool_calls
    assert calls and r.choices[0].finish_reason == "tool_calls"
    for call in calls:
        _check_call(call)
    indexes = [tc.index for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert indexes == sorted(indexes) and set(indexes) == set(range(len(calls)))


@pytest.mark.parametrize("stream", [False, True])
def test_round_trip_call_result_answer(client: OpenAI, stream: bool) -> None:
    first = client.chat.completions.create(model="default", messages=ASK[:1], tools=[WEATHER],
                                           tool_choice="required", temperature=0, max_tokens=60,
                                           parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 18})}]
    kw = {"messages": history, "tools": [WEATHER], "tool_choice": "none", "temperature": 0, "max_tokens": 24}
    r = _stream(client, **kw)[0] if stream else client.chat.completions.create(model="default", **kw)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls


@pytest.mark.parametrize("stream", [False, True])
def test_json_object(client: OpenAI, stream: bool) -> None:
    kw = {"messages": [{"role": "user", "content": "Give a JSON object with the name and age of a cat."}], "temperature": 0, "max_tokens": 100,
              "response_format": {"type": "json_object"}}
    r = _stream(client, **kw)[0] if stream else client.chat.completions.create(model="default", **kw)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)


class Person(BaseModel):
    name: str
    age: int
    city: str


def test_parse_with_pydantic_model(client: OpenAI) -> None:
    r = client.chat.completions.parse(model="default", response_format=Person, temperature=0, max_tokens=80,
                                      messages=[{"role": "user", "content": "Invent a person."}])
    assert isinstance(r.choices[0].message.parsed, Person)


def test_json_schema_streamed(client: OpenAI) -> None:
    with client.chat.completions.stream(model="default", response_format=Person, temperature=0, max_tokens=80,
                                        messages=[{"role": "user", "content": "Invent a person."}]) as s:
        final = s.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Person)


def test_fifty_seeds_parse_and_validate(client: OpenAI) -> None:
    schema = {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 24}, "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "genres": {"type": "array", "items": {"enum": ["drama", "comedy", "horror", "sci-fi"]}, "maxItems": 3},
        "rating": {"type": "integer", "minimum": 1, "maximum": 10}}, "required": ["title", "year", "genres", "rating"],
        "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "movie", "schema": schema, "strict": True}}
    import concurrent.futures as cf

    def one(seed: int) -> str:
        r = client.chat.completions.create(model="default", temperature=1.0, seed=seed, max_tokens=120,
                                           response_format=rf,
                                           messages=[{"role": "user", "content": "Describe a movie as JSON."}])
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        return r.choices[0].message.content

    with cf.ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(one, range(50)))
    for text in texts:
        jsonschema.validate(json.loads(text), schema)
    assert len(set(texts)) > 10  # the seeds really sample differently


@pytest.mark.parametrize(("kw", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "array", "uniqueItems": True}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "response_format.json_schema.schema"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools.0.function.parameters"),
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, "messages"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_input_is_a_400_naming_the_field(client: OpenAI, kw: dict, param: str) -> None:
    kw.setdefault("messages", ASK)
    with pytest.raises(BadRequestError) as err:
        client.chat.completions.create(model="default", max_tokens=5, **kw)
    body = err.value.body
    assert body["type"] == "invalid_request_error" and body["param"].startswith(param), body


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs(client: OpenAI, stream: bool) -> None:
    kw = {"messages": [{"role": "user", "content": "Say hi."}], "temperature": 0, "max_tokens": 6,
          "logprobs": True, "top_logprobs": 3}
    if stream:
        entries = [e for c in client.chat.completions.create(model="default", stream=True, **kw)
                   if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        text = None
    else:
        r = client.chat.completions.create(model="default", **kw)
        entries, text = r.choices[0].logprobs.content, r.choices[0].message.content
    assert entries and all(e.logprob <= 0 and len(e.top_logprobs) == 3 for e in entries)
    # greedy: the chosen token is the likeliest one
    assert all(e.top_logprobs[0].logprob == pytest.approx(e.logprob) for e in entries)
    if text is not None:
        assert "".join(e.token for e in entries) == text


def test_completion_logprobs(client: OpenAI) -> None:
    r = client.completions.create(model="default", prompt="The capital of France is", max_tokens=4,
                                  temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text and all(len(t) == 2 for t in lp.top_logprobs)


def test_ask_json_schema(default_model: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from ortserve.cli.main import cli

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"], "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    r = CliRunner().invoke(cli, ["ask", "Name a capital in Europe.", "--model", str(default_model), "--json",
                                 "--json-schema", str(tmp_path / "s.json"), "--temperature", "1.0", "--seed", "3"])
    assert r.exit_code == 0, r.output
    answer = json.loads(r.output[r.output.index("{"):])["results"][0]["answer"]
    jsonschema.validate(json.loads(answer), schema)
