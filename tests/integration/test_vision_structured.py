"""Tools, response_format, n and logprobs on a vision model (issue 42), through the real openai
client: the random-weight Qwen2.5-VL (tests/conftest.py ``tiny_vl``) answers under the same grammar
and sampling as a text engine, so the grammar forces a call's and a schema's shape."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest
from tests.integration.test_vision import MODEL, data_url, png
from tests.servers import ServerThread

from ortserve.models.store import Variant

pytest.importorskip("mobius")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
SCHEMA = {"type": "object", "properties": {"animal": {"type": "string", "maxLength": 10},
                                           "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
          "required": ["animal", "legs"], "additionalProperties": False}


def ask(image: bool = True) -> list[dict]:
    parts = [{"type": "text", "text": "What is in this picture?"}]
    if image:
        parts.append({"type": "image_url", "image_url": {"url": data_url(png())}})
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def client(tiny_model: Path, tiny_vl: tuple[Path, Path, Variant]):
    with ServerThread(tiny_model, home=str(tiny_vl[1])) as s:
        yield openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", timeout=120, max_retries=0)


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_tool_call_on_an_image_parses(client: openai.OpenAI, stream: bool) -> None:
    kw: dict = {"model": MODEL, "messages": ask(), "tools": [WEATHER], "tool_choice": "required", "max_tokens": 60,
                "temperature": 0}
    if not stream:
        r = client.chat.completions.create(**kw)
        calls, finish = r.choices[0].message.tool_calls, r.choices[0].finish_reason
        name, args = calls[0].function.name, calls[0].function.arguments
    else:
        name, args, finish = "", "", None
        for chunk in client.chat.completions.create(**kw, stream=True):
            for c in chunk.choices:
                for t in c.delta.tool_calls or []:
                    name += t.function.name or ""
                    args += t.function.arguments or ""
                finish = c.finish_reason or finish
    assert finish == "tool_calls"
    assert name == "get_weather"
    assert isinstance(json.loads(args)["city"], str)


def test_json_schema_output_on_an_image_validates(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=ask(), max_tokens=60, temperature=0,
                                       response_format={"type": "json_schema",
                                                        "json_schema": {"name": "pet", "schema": SCHEMA}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    # json_object on a text-only turn to the vision model: an object
    r = client.chat.completions.create(model=MODEL, messages=ask(image=False), max_tokens=40, temperature=0,
                                       response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_n_choices_and_logprobs_on_an_image(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=ask(), max_tokens=6, temperature=1.0, seed=3, n=2,
                                       logprobs=True, top_logprobs=2)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    for c in r.choices:
        entries = c.logprobs.content
        assert entries and "".join(e.token for e in entries) == c.message.content
        for e in entries:
            assert e.logprob <= 0 and len(e.top_logprobs) == 2
            assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
    # the seeds are seed and seed + 1, as for a text engine: the same request gives the same choices
    again = client.chat.completions.create(model=MODEL, messages=ask(), max_tokens=6, temperature=1.0, seed=3, n=2)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]


def test_bad_tools_on_a_vision_model_name_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ask(), tools=[WEATHER], tool_choice="required",
                                       response_format={"type": "json_object"}, max_tokens=20)
    assert err.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ask(), tools=[WEATHER], tool_choice="nope",
                                       max_tokens=20)
    assert err.value.body["param"] == "tool_choice"
    r = client.chat.completions.create(model=MODEL, messages=ask(), max_tokens=2)   # and it keeps serving
    assert r.choices[0].message.content is not None


def test_tools_on_an_image_through_responses_and_messages(client: openai.OpenAI) -> None:
    import anthropic

    fn = WEATHER["function"]
    r = client.responses.create(model=MODEL, max_output_tokens=60, temperature=0, tool_choice="required",
                                tools=[{"type": "function", "name": fn["name"], "parameters": fn["parameters"]}],
                                input=[{"role": "user", "content": [
                                    {"type": "input_text", "text": "What is in this picture?"},
                                    {"type": "input_image", "image_url": data_url(png())}]}])
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and isinstance(json.loads(calls[0].arguments)["city"], str)
    claude = anthropic.Anthropic(base_url=str(client.base_url).removesuffix("/v1/"), api_key="x", max_retries=0,
                                 timeout=120)
    # greedy, as the Responses call above (anthropic 2.14's create has no temperature argument: the
    # body carries it): at the default temperature 1.0 the random test model can spend the 60 tokens
    # inside the argument string (seen once in CI: stop_reason max_tokens)
    msg = claude.messages.create(model=MODEL, max_tokens=60, extra_body={"temperature": 0}, tool_choice={"type": "any"},
                                 tools=[{"name": fn["name"], "input_schema": fn["parameters"]}],
                                 messages=[{"role": "user", "content": [
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": data_url(png()).split(",", 1)[1]}},
                                     {"type": "text", "text": "What is in this picture?"}]}])
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and uses[0].name == "get_weather" and isinstance(uses[0].input["city"], str)
    # Anthropic clients send a large max_tokens to every model: a ceiling, cut to the context left
    msg = claude.messages.create(model=MODEL, max_tokens=32000, messages=[{"role": "user", "content": "hi " * 4000}])
    room = 4096 - msg.usage.input_tokens   # the test model's context
    assert 0 < room < 100 and 0 < msg.usage.output_tokens <= room
    assert msg.stop_reason in ("end_turn", "max_tokens")
