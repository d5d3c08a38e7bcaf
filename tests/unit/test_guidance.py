"""Grammar masks, the tool-call grammar and parser, and the chat-template environment; no model:
a byte-level BPE tokenizer trained here in a few milliseconds stands in for the model's."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ortserve.engine.guidance import Constraint, Guidance, allocate_masks, apply_mask
from ortserve.engine.tokenizer import TextCodec, template_env
from ortserve.engine.tools import (
    ToolCallParser,
    call_text,
    fallback_messages,
    parse_choice,
    parse_tools,
    tool_grammar,
)
from ortserve.errors import InvalidRequest
from ortserve.types import SamplingParams

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
EOS = 0


@pytest.fixture(scope="module")
def guidance(tmp_path_factory: pytest.TempPathFactory) -> Guidance:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ['{"city": "Paris"}', "<tool_call>\n", '{"name": "get_weather", "arguments": ', "hello world"] * 20
    tok.train_from_iterator(text, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    g = Guidance(path, tok.get_vocab_size(), (EOS,))
    g.raw = tok  # type: ignore[attr-defined]
    return g


def _run(guidance: Guidance, constraint: Constraint, text: str) -> bool:
    """Feed ``text`` token by token through the mask; True if every token was allowed and the end is."""
    guide = guidance.guide(constraint)
    mask = allocate_masks(1, guidance.vocab_size)[0]
    for t in guidance.raw.encode(text).ids:  # type: ignore[attr-defined]
        guide.compute_mask(mask)
        logits = np.zeros(guidance.vocab_size, dtype=np.float32)
        apply_mask(logits, mask)
        if not np.isfinite(logits[t]):
            return False
        guide.consume(t)
    guide.compute_mask(mask)
    logits = np.zeros(guidance.vocab_size, dtype=np.float32)
    apply_mask(logits, mask)
    return bool(np.isfinite(logits[EOS]))


def test_json_schema_mask_allows_valid_and_forbids_invalid(guidance: Guidance) -> None:
    c = Constraint.json_schema(WEATHER["function"]["parameters"])
    assert _run(guidance, c, '{"city": "Paris"}')
    assert not _run(guidance, c, '{"town": "Paris"}')
    assert not _run(guidance, c, '{"city": 3}')


def test_compiled_grammars_are_cached_by_content(guidance: Guidance) -> None:
    c = Constraint("regex", "[a-z]+ [a-z]+")
    before = guidance.compiles
    guidance.guide(c)
    guidance.guide(Constraint("regex", "[a-z]+ [a-z]+", param="other"))
    assert guidance.compiles == before + 1 and guidance.hits >= 1
    assert _run(guidance, c, "hello world") and not _run(guidance, c, "hello")


@pytest.mark.parametrize(("schema", "word"), [({"type": "array", "uniqueItems": True}, "uniqueItems"),
                                              ({"type": "strin"}, "strin"), ({"not": {}}, "not")])
def test_unenforceable_schema_is_a_400_naming_the_keyword(guidance: Guidance, schema: dict, word: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        guidance.guide(Constraint.json_schema(schema, param="response_format.json_schema.schema"))
    assert word in err.value.message and err.value.param == "response_format.json_schema.schema"


def test_sampling_params_take_one_constraint() -> None:
    p = SamplingParams(json_schema={"type": "object", "properties": {"b": {}, "a": {}}})
    assert list(json.loads(p.json_schema)["properties"]) == ["b", "a"]  # property order is kept
    with pytest.raises(InvalidRequest) as err:
        SamplingParams(regex="a", grammar="start: /a/")
    assert err.value.param == "grammar"


def test_tool_grammar_modes(guidance: Guidance) -> None:
    tools = parse_tools([WEATHER])
    call = call_text("get_weather", '{"city": "Paris"}')
    required = Constraint("grammar", tool_grammar(tools, "required") or "")
    assert _run(guidance, required, call) and _run(guidance, required, call + "\n" + call)
    assert not _run(guidance, required, "hello world")
    auto = Constraint("grammar", tool_grammar(tools, "auto") or "")
    assert _run(guidance, auto, call) and _run(guidance, auto, "hello world")
    single = Constraint("grammar", tool_grammar(tools, "auto", parallel=False) or "")
    assert not _run(guidance, single, call + "\n" + call)
    assert tool_grammar(tools, "none") is None


def test_tool_choice_and_tools_are_checked() -> None:
    tools = parse_tools([WEATHER])
    assert parse_choice(None, tools) == "auto" and parse_choice(None, []) == "none"
    assert parse_choice({"type": "function", "function": {"name": "get_weather"}}, tools) == "get_weather"
    with pytest.raises(InvalidRequest) as err:
        parse_choice({"type": "function", "function": {"name": "nope"}}, tools)
    assert err.value.param == "tool_choice"
    with pytest.raises(InvalidRequest) as err:
        parse_tools([{"type": "function", "function": {"name": "f"}}])
    assert err.value.param == "tools.0.function.parameters"
    with pytest.raises(InvalidRequest):
        parse_tools([WEATHER, WEATHER])


def test_parser_streams_arguments_as_they_come() -> None:
    text = (call_text("get_weather", '{"city": "Pa}r\\"is", "n": [1, {"x": 2}]}') + "\n" +
            call_text("get_time", "{}"))
    p = ToolCallParser()
    pieces = [d for ch in text for d in p.feed(ch)] + p.finish()
    assert [c.name for c in p.calls] == ["get_weather", "get_time"] and p.content == ""
    assert json.loads(p.calls[0].arguments) == {"city": 'Pa}r"is', "n": [1, {"x": 2}]}
    assert p.calls[1].arguments == "{}"
    starts = [d for d in pieces if d.call is not None]
    assert [d.index for d in starts] == [0, 1] and len({d.call.id for d in starts}) == 2
    args = [d.arguments for d in pieces if d.index == 0 and d.arguments]
    assert len(args) > 10 and "".join(args) == p.calls[0].arguments  # one piece per character fed


def test_parser_passes_prose_through() -> None:
    p = ToolCallParser()
    assert [d.content for d in p.feed("Hello")] == ["Hello"] and p.finish() == []
    assert p.calls == [] and p.content == "Hello"


def test_fallback_renders_tools_calls_and_results() -> None:
    tools = parse_tools([WEATHER])
    msgs = fallback_messages([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "-3 C"}], tools)
    assert msgs[0]["role"] == "system" and '"get_weather"' in msgs[0]["content"]
    assert msgs[2]["content"] == call_text("get_weather", '{"city": "Oslo"}')
    assert msgs[3] == {"role": "user", "content": "<tool_response>\n-3 C\n</tool_response>"}


def test_template_env_is_hugging_face_like() -> None:
    env = template_env()
    out = env.from_string('{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}'
                          '{{ {"b": 1, "a": "é"} | tojson(indent=2, sort_keys=True) }}{{ strftime_now("%Y") | length }}'
                          ).render()
    assert out == '13{\n  "a": "é",\n  "b": 1\n}4'
    with pytest.raises(InvalidRequest):
        env.from_string("{{ raise_exception('no') }}").render()


def test_a_tool_template_gets_tools_and_tool_messages() -> None:
    template = ("{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
                "{% for m in messages %}{{ m.role }}:{{ m.content }}"
                "{% for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}"
                "{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}\n{% endfor %}")
    codec = TextCodec.__new__(TextCodec)
    codec.chat_template, codec._compiled, codec.bos_token, codec.eos_token = template, None, None, None
    out = codec.render_chat([
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "cold"}], tools=parse_tools([WEATHER]))
    # (trim_blocks eats the newline after a block tag, as in transformers)
    assert out == 'TOOLS:get_weather;user:hiassistant:[get_weather {"city": "Oslo"}]tool:cold(c1)'
