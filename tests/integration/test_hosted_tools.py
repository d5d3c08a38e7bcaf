"""Hosted tools that clients offer, on the real default model: the ones that need a service ortserve
does not have offline (web search, image generation, a code sandbox; Anthropic's server tools) are
left out and the answer says so (header, Responses' ``ortserve_warnings``); ``file_search`` runs on the
server's own vector stores. Driven by the clients that send them: Codex CLI's request shape through
the openai client, the OpenAI Agents SDK's WebSearchTool and FileSearchTool, and the anthropic client."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from openai import BadRequestError, NotFoundError, OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers import ServerThread

pytestmark = pytest.mark.default_model
WARNING = "x-ortserve-warning"
TEA = "How hot should the water be for green tea?"
# Codex CLI 0.171's default request (its tools list: function tools, then the hosted web_search)
CODEX_TOOLS: list[Any] = [
    {"type": "function", "name": "shell", "description": "Runs a shell command and returns its output.",
     "strict": False, "parameters": {"type": "object", "properties": {
         "command": {"type": "array", "items": {"type": "string"}}, "workdir": {"type": "string"}},
         "required": ["command"], "additionalProperties": False}},
    {"type": "function", "name": "update_plan", "description": "Updates the task plan.", "strict": False,
     "parameters": {"type": "object", "properties": {"explanation": {"type": "string"}}, "additionalProperties": False}},
    {"type": "web_search"},
]
CODEX_INPUT: list[Any] = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a coding agent."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello in one word."}]}]


@pytest.fixture(scope="module")
def srv(default_model: Path, embedding_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    tmp = tmp_path_factory.mktemp("hosted")
    with ServerThread(default_model, model_id="smollm2", rag_dir=tmp / "rag") as s:
        yield s


@pytest.fixture(scope="module")
def oai(srv: ServerThread) -> OpenAI:
    return OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def store(oai: OpenAI) -> Any:
    vs = oai.vector_stores.create(name="facts")
    for name, text in [("tea.txt", "Green tea should be brewed with water at 80 degrees Celsius."),
                       ("bikes.txt", "Oil a bicycle chain every 300 kilometres.")]:
        f = oai.files.create(file=(name, text.encode()), purpose="assistants")
        oai.vector_stores.files.create_and_poll(vector_store_id=vs.id, file_id=f.id)
    return vs


def test_codex_default_request_with_web_search_answers(oai: OpenAI) -> None:
    raw = oai.responses.with_raw_response.create(
        model="smollm2", instructions="You are Codex.", input=CODEX_INPUT, tools=CODEX_TOOLS, tool_choice="auto",
        parallel_tool_calls=False, reasoning={"summary": "auto"}, store=False, stream=True,
        include=["reasoning.encrypted_content"], prompt_cache_key="thread-1", max_output_tokens=24)
    assert raw.status_code == 200 and "web_search" in raw.headers[WARNING]
    events = list(raw.parse())
    done = events[-1]
    assert done.type in ("response.completed", "response.incomplete")
    assert done.response.model_extra["ortserve_warnings"] == [raw.headers[WARNING]]
    assert [t.type for t in done.response.tools] == ["function", "function", "web_search"]  # echoed as sent
    assert done.response.output and done.response.usage.output_tokens > 0
    # the tool is not offered: the prompt is the one without it
    without = oai.responses.input_tokens.count(model="smollm2", instructions="You are Codex.", input=CODEX_INPUT,
                                               tools=CODEX_TOOLS[:2])
    assert done.response.usage.input_tokens == without.input_tokens
    # not streamed, other hosted tools: each one named once
    r = oai.responses.with_raw_response.create(model="smollm2", input="Hi", max_output_tokens=4, tools=[
        {"type": "image_generation"}, {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "web_search_preview"}, {"type": "image_generation"}])
    assert r.status_code == 200 and r.headers[WARNING].endswith(": image_generation, code_interpreter, web_search_preview")
    assert r.parse().status in ("completed", "incomplete")


def test_a_hosted_tool_cannot_be_required(oai: OpenAI) -> None:
    with pytest.raises(BadRequestError) as e:
        oai.responses.create(model="smollm2", input="Hi", tools=[{"type": "web_search_preview"}],
                             tool_choice={"type": "web_search_preview"})
    assert e.value.body["param"] == "tool_choice.type"  # type: ignore[index]
    with pytest.raises(BadRequestError) as e:  # a client tool in a syntax the models do not speak: still a 400
        oai.responses.create(model="smollm2", input="Hi", tools=[{"type": "local_shell"}])
    assert e.value.body["param"] == "tools.0.type"  # type: ignore[index]


def test_file_search_runs_on_the_local_vector_stores(oai: OpenAI, store: Any) -> None:
    tool: Any = {"type": "file_search", "vector_store_ids": [store.id], "max_num_results": 1}
    r = oai.responses.create(model="smollm2", input=TEA, tools=[tool], include=["file_search_call.results"],
                             max_output_tokens=8, temperature=0)
    fs = r.output[0]
    assert fs.type == "file_search_call" and fs.status == "completed" and fs.queries == [TEA]
    assert fs.results is not None and [x.filename for x in fs.results] == ["tea.txt"]
    assert "80 degrees" in (fs.results[0].text or "") and r.output[-1].type == "message"
    assert oai.responses.create(model="smollm2", input=TEA, tools=[tool], max_output_tokens=2).output[0].results is None
    # the results went to the model: the prompt holds them, and input_tokens counts the same prompt
    plain = oai.responses.input_tokens.count(model="smollm2", input=TEA).input_tokens
    counted = oai.responses.input_tokens.count(model="smollm2", input=TEA, tools=[tool]).input_tokens
    source = len(httpx.post(f"{oai.base_url}".replace("/v1/", "") + "/tokenize",
                            json={"content": fs.results[0].text}).json()["tokens"])
    assert r.usage is not None and r.usage.input_tokens == counted >= plain + source
    # streamed: the search's events come first, the item is output 0; the stored turn continues
    events = list(oai.responses.create(model="smollm2", input=TEA, tools=[tool], max_output_tokens=4, stream=True))
    kinds, final = [ev.type for ev in events], events[-1].response  # type: ignore[union-attr]
    assert kinds[2:7] == ["response.output_item.added", "response.file_search_call.in_progress",
                          "response.file_search_call.searching", "response.file_search_call.completed",
                          "response.output_item.done"]
    assert final.output[0].type == "file_search_call"
    follow = oai.responses.create(model="smollm2", input="Thanks.", previous_response_id=final.id, max_output_tokens=2)
    assert follow.previous_response_id == final.id
    # a client sending the items back as its own history (store off): they are accepted
    again = oai.responses.create(model="smollm2", max_output_tokens=2, input=[
        {"role": "user", "content": TEA}, r.output[0].model_dump(exclude_none=True),  # type: ignore[list-item]
        {"role": "user", "content": "And for black tea?"}])
    assert again.status in ("completed", "incomplete")


def test_file_search_bad_fields_name_themselves(oai: OpenAI, store: Any) -> None:
    with pytest.raises(NotFoundError):
        oai.responses.create(model="smollm2", input=TEA, tools=[{"type": "file_search", "vector_store_ids": ["vs_nope"]}])
    for tool, field in [({"vector_store_ids": []}, "tools.0.vector_store_ids"),
                        ({"vector_store_ids": [store.id], "max_num_results": 0}, "tools.0.max_num_results"),
                        ({"vector_store_ids": [store.id], "ranking_options": {"ranker": "magic"}},
                         "tools.0.ranking_options.ranker"),
                        ({"vector_store_ids": [store.id], "frob": 1}, "tools.0.frob")]:
        with pytest.raises(BadRequestError) as e:
            oai.responses.create(model="smollm2", input=TEA, tools=[{"type": "file_search", **tool}])  # type: ignore[list-item]
        assert e.value.body["param"] == field  # type: ignore[index]


def test_agents_sdk_web_search_and_file_search_tools(srv: ServerThread, store: Any) -> None:
    from agents import (
        Agent,
        FileSearchTool,
        ModelSettings,
        Runner,
        WebSearchTool,
        set_default_openai_client,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0),
                              use_for_tracing=False)
    agent = Agent(name="tea", instructions="Answer in one sentence.", model="smollm2",
                  tools=[WebSearchTool(), FileSearchTool(vector_store_ids=[store.id], max_num_results=1,
                                                         include_search_results=True)],
                  model_settings=ModelSettings(max_tokens=200, temperature=0))
    result = asyncio.run(Runner.run(agent, TEA, max_turns=2))
    assert isinstance(result.final_output, str) and result.final_output.strip()
    searched = [i.raw_item for i in result.new_items if getattr(i.raw_item, "type", None) == "file_search_call"]
    assert searched and searched[0].results[0].filename == "tea.txt"


def test_anthropic_server_tools_are_left_out(srv: ServerThread) -> None:
    claude = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0, timeout=120)
    weather = {"name": "get_weather", "description": "Current weather in a city",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    raw = claude.messages.with_raw_response.create(
        model="smollm2", max_tokens=8, messages=[{"role": "user", "content": "Hi"}],
        tools=[{"type": "web_search_20250305", "name": "web_search", "max_uses": 2}, weather])  # type: ignore[list-item]
    assert raw.status_code == 200 and raw.headers[WARNING].endswith(": web_search_20250305")
    assert raw.parse().usage.output_tokens > 0
    count = claude.messages.count_tokens(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                         tools=[weather])  # type: ignore[list-item]
    used = raw.parse().usage
    assert used.input_tokens + (used.cache_read_input_tokens or 0) == count.input_tokens


def test_chat_web_search_options_are_left_out(oai: OpenAI) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model="smollm2", max_tokens=4, messages=[{"role": "user", "content": "Hi"}],
        web_search_options={"search_context_size": "low"})
    assert raw.status_code == 200 and raw.headers[WARNING].endswith(": web_search_options")
    assert raw.parse().choices[0].message.content
    plain = oai.chat.completions.with_raw_response.create(model="smollm2", max_tokens=2,
                                                          messages=[{"role": "user", "content": "Hi"}])
    assert WARNING not in plain.headers
