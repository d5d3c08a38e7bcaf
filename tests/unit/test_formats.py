"""Each family's own chat template (the REAL ones, llama.cpp's models/templates) rendered with tools,
an assistant's tool calls and a tool result, and each tool-call syntax's text parsed back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llamacpp import template

from ortserve.engine.formats import FORMATS, ToolCallParser, detect
from ortserve.engine.tokenizer import TextCodec
from ortserve.engine.tools import parse_tools
from ortserve.errors import InvalidRequest

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CONVERSATION = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0123456789abcdef01234567", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_0123456789abcdef01234567", "content": '{"temp_c": 21}'},
]
# template -> (the format it speaks, markers its rendering must contain)
FAMILIES = {
    "meta-llama-Llama-3.1-8B-Instruct": ("llama3_json", ["<|start_header_id|>ipython<|end_header_id|>",
                                                         '{"name": "get_weather", "parameters": {"city": "Paris"}}',
                                                         '"name": "get_weather"']),
    "meta-llama-Llama-3.2-3B-Instruct": ("llama3_json", ["<|start_header_id|>ipython<|end_header_id|>",
                                                         '{"name": "get_weather", "parameters": {"city": "Paris"}}']),
    "meta-llama-Llama-3.3-70B-Instruct": ("llama3_json", ["<|start_header_id|>ipython<|end_header_id|>",
                                                          '{"name": "get_weather", "parameters": {"city": "Paris"}}']),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": ("hermes", ["<tool_call>", "<tool_response>"]),
    "Qwen-Qwen2.5-7B-Instruct": ("hermes", ["<tools>", "<tool_call>\n{\"name\": \"get_weather\"",
                                            "<tool_response>\n{\"temp_c\": 21}"]),
    "Qwen-Qwen3-0.6B": ("hermes", ["<tools>", "<tool_call>\n{\"name\": \"get_weather\"", "<tool_response>"]),
    "microsoft-Phi-3.5-mini-instruct": ("hermes", ["<|system|>", ("<tool_call>\n{\"name\": \"get_weather\", "
                                                   "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
                                                   "<tool_response>", "<|assistant|>"]),
    "google-gemma-2-2b-it": ("gemma", ["<start_of_turn>user\nYou are a weather bot.", ("```tool_code\n{\"name\": "
                                       "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```"),
                                       "```tool_output\n{\"temp_c\": 21}\n```", "<start_of_turn>model"]),
    "mistralai-Mistral-Nemo-Instruct-2407": ("mistral", ["[AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]",
                                                         '"name": "get_weather"']),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("hermes", ["<tools>", "<tool_call>", "<tool_response>"]),
    "Mistral-Small-3.2-24B-Instruct-2506": ("mistral_v11", ["[AVAILABLE_TOOLS]", "[TOOL_CALLS]get_weather[CALL_ID]",
                                                            '[ARGS]{"city": "Paris"}', "[TOOL_CONTENT]"]),
    "unsloth-mistral-Devstral-Small-2507": ("mistral_v11", [
        "[AVAILABLE_TOOLS]", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', '[TOOL_RESULTS]{"temp_c": 21}']),
    "mistralai-Ministral-3-14B-Reasoning-2512": ("mistral_v11", [
        "[AVAILABLE_TOOLS]", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', '[TOOL_RESULTS]{"temp_c": 21}']),
}


def codec(text: str) -> TextCodec:
    c = TextCodec.__new__(TextCodec)
    c.chat_template, c._compiled, c.bos_token, c.eos_token = text, None, "<s>", "</s>"
    c.tool_format = detect(text)
    return c


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_real_template_renders_tools_calls_and_results(name: str) -> None:
    fmt, markers = FAMILIES[name]
    c = codec(template(name))
    assert c.tool_format.name == fmt
    out = c.render_chat(CONVERSATION, tools=parse_tools([WEATHER]))
    for marker in markers:
        assert marker in out, (marker, out)
    assert "Weather in Paris?" in out and "You are a weather bot." in out and "21" in out
    if fmt == "mistral":  # the template's 9-character ids: the client's id mapped, the same on both sides
        ids = {s.split('"')[0] for s in out.split('"id": "')[1:]} | {s[:9] for s in out.split('"call_id": "')[1:]}
        assert len(ids) == 1 and len(ids.pop()) == 9


def test_llama3_splits_parallel_calls_for_its_single_call_template() -> None:
    two = [*CONVERSATION[:2], {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": c})}}
        for i, c in enumerate(["Paris", "Oslo"])]}, {"role": "tool", "tool_call_id": "c0", "content": "21"},
        {"role": "tool", "tool_call_id": "c1", "content": "9"}]
    out = codec(template("meta-llama-Llama-3.1-8B-Instruct")).render_chat(two, tools=parse_tools([WEATHER]))
    assert '"parameters": {"city": "Paris"}' in out and '"parameters": {"city": "Oslo"}' in out


def test_detection_order_vocab_and_override() -> None:
    assert detect(None).name == "hermes"
    assert detect("{{ messages }}", ["[TOOL_CALLS]"]).name == "mistral"
    assert detect("{{ messages }}", ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"]).name == "mistral_v11"
    assert detect("{{ messages }}", ["<|tool_call|>", "<|/tool_call|>"]).name == "phi4"
    assert detect("{{ messages }}", ["<|python_tag|>"]).name == "llama3_json"
    assert detect(template("Qwen-Qwen2.5-7B-Instruct"), override="gemma").name == "gemma"
    with pytest.raises(InvalidRequest, match="tool_format"):
        detect(None, override="nope")


CASES = {  # the exact text a model writes in each syntax for two calls, and the calls it means
    "hermes": '<tool_call>\n{"name": "a", "arguments": {"x": "}{"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',
    "llama3_json": '{"name": "a", "parameters": {"x": "}{"}}; {"name": "b", "parameters": {}}',
    "mistral": '[TOOL_CALLS][{"name": "a", "arguments": {"x": "}{"}}, {"name": "b", "arguments": {}}]',
    "mistral_v11": '[TOOL_CALLS]a[ARGS]{"x": "}{"}[TOOL_CALLS]b[ARGS]{}',
    "phi4": '<|tool_call|>[{"name": "a", "arguments": {"x": "}{"}}, {"name": "b", "arguments": {}}]<|/tool_call|>',
    "gemma": '```tool_code\n{"name": "a", "arguments": {"x": "}{"}}\n```\n```tool_code\n{"name": "b", '
             '"arguments": {}}\n```',
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_each_syntax_parses_back_streamed_and_whole(name: str, piece: int) -> None:
    fmt, text = FORMATS[name], CASES[name]
    assert fmt.calls_text([("a", '{"x": "}{"}'), ("b", "{}")]) == text
    p = ToolCallParser(fmt)
    deltas = [d for i in range(0, len(text), piece) for d in p.feed(text[i:i + piece])] + p.finish()
    assert [(c.name, c.arguments) for c in p.calls] == [("a", '{"x": "}{"}'), ("b", "{}")]
    assert p.content == "" and not p.repeated
    streamed: dict[int, str] = {}
    for d in deltas:
        streamed[d.index] = streamed.get(d.index, "") + d.arguments
    assert streamed == {0: '{"x": "}{"}', 1: "{}"}
    if name in ("mistral", "mistral_v11"):
        assert all(len(c.id) == 9 and c.id.isalnum() for c in p.calls)


@pytest.mark.parametrize("name", sorted(CASES))
def test_prose_repeat_and_dropped_markers(name: str) -> None:
    fmt = FORMATS[name]
    p = ToolCallParser(fmt)
    p.feed("The weather is fine."), p.finish()
    assert p.content == "The weather is fine." and not p.calls
    rep = ToolCallParser(fmt)
    rep.feed(fmt.calls_text([("a", '{"x": 1}'), ("a", '{"x": 1}')]))
    rep.finish()
    assert rep.repeated and [c.arguments for c in rep.calls] == ['{"x": 1}']
    # a decoder that skips special tokens drops [TOOL_CALLS], [ARGS], <|tool_call|>: the calls still parse
    bare = CASES[name]
    for marker in ("[TOOL_CALLS]", "[ARGS]", "<|tool_call|>", "<|/tool_call|>"):
        bare = bare.replace(marker, "")
    q = ToolCallParser(fmt)
    q.feed(bare), q.finish()
    assert [c.name for c in q.calls] == ["a", "b"]


def test_llama3_python_tag_accepted() -> None:
    p = ToolCallParser(FORMATS["llama3_json"])
    p.feed('<|python_tag|>{"name": "a", "parameters": {"q": 1}}'), p.finish()
    assert [(c.name, c.arguments) for c in p.calls] == [("a", '{"q": 1}')] and p.content == ""


# Phi-4-mini-instruct's template is not in llama.cpp's set; this one has its published shape: the
# tools come from the system message's "tools" field, each turn's content only is rendered
PHI4_TEMPLATE = ("{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and "
                 "message['tools'] is not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' "
                 "+ message['tools'] + '<|/tool|>' + '<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + "
                 "message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
                 "{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")


def test_phi4_tools_go_into_the_system_turn() -> None:
    c = codec(PHI4_TEMPLATE)
    assert c.tool_format.name == "phi4"
    out = c.render_chat(CONVERSATION, tools=parse_tools([WEATHER]))
    assert out.startswith('<|system|>You are a weather bot.<|tool|>[{"name": "get_weather"')
    assert '<|assistant|><|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]<|/tool_call|>' in out
    assert '<|user|><|tool_response|>{"temp_c": 21}<|/tool_response|><|end|><|assistant|>' in out


@pytest.mark.parametrize("name", ["Mistral-Small-3.2-24B-Instruct-2506", "unsloth-mistral-Devstral-Small-2507",
                                  "mistralai-Ministral-3-14B-Reasoning-2512"])
def test_mistral_v11_round_trip_through_the_real_template(name: str) -> None:
    """Two calls as a v11 model writes them (markers dropped by the decoder), read back into OpenAI
    tool_calls, sent back with their results (one result keyed by a client id of another shape) and
    rendered by the real template: the template writes the calls in the syntax the model wrote, each
    result under its call's 9-character id (Small 3.2 writes the ids; the others have none)."""
    c = codec(template(name))
    fmt = c.tool_format
    assert fmt.name == "mistral_v11"
    p = ToolCallParser(fmt)
    p.feed('get_weather{"city": "Paris"}get_weather{"city": "Oslo"}'), p.finish()
    calls = [call.as_openai() for call in p.calls]
    assert [json.loads(x["function"]["arguments"]) for x in calls] == [{"city": "Paris"}, {"city": "Oslo"}]
    calls[1]["id"] = "call_0123456789abcdef01234567"  # a client may send back an id of its own
    messages = [*CONVERSATION[:2], {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "tool_call_id": calls[0]["id"], "content": "21 C"},
                {"role": "tool", "tool_call_id": calls[1]["id"], "content": "9 C"}]
    out = c.render_chat(messages, tools=parse_tools([WEATHER]))
    written = [(x["function"]["name"], x["function"]["arguments"]) for x in calls]
    if "[CALL_ID]" not in template(name):
        assert fmt.calls_text(written) + "</s>[TOOL_RESULTS]21 C[/TOOL_RESULTS][TOOL_RESULTS]9 C[/TOOL_RESULTS]" in out
        return
    ids = [s[:9] for s in out.split("[CALL_ID]")[1:]]
    assert ids[0] == p.calls[0].id and len(ids[1]) == 9 and ids[1].isalnum() and ids[0] != ids[1]
    with_ids = "".join(f"[TOOL_CALLS]{n}[CALL_ID]{i}[ARGS]{a}" for (n, a), i in zip(written, ids, strict=True))
    assert with_ids + "</s>" in out
    assert f"[TOOL_RESULTS]{ids[0]}[TOOL_CONTENT]21 C[/TOOL_RESULTS][TOOL_RESULTS]{ids[1]}[TOOL_CONTENT]9 C" in out
    again = ToolCallParser(fmt)  # what the template wrote reads back as the same calls
    again.feed(with_ids), again.finish()
    assert [(x.id, x.name, x.arguments) for x in again.calls] == [(i, n, a) for (n, a), i in zip(written, ids,
                                                                                                   strict=True)]
