"""Prose before the calls under ``tool_choice: auto``, for every syntax whose calls begin with a
marker the text shows (``ToolFormat.lead_prose``): the grammar allows prose, calls, or prose then
calls, and never the marker inside prose; the parser splits the prose from the calls however the
text is cut. Syntaxes where the text cannot show where prose ends keep "prose or calls"."""

from __future__ import annotations

from pathlib import Path

import pytest

from ortserve.engine.formats import FORMATS, LEAD, TOOL_MARK, Tool, ToolCallParser
from ortserve.engine.guidance import Constraint, Guidance

TOOLS = [Tool("get_weather", "Weather in a city", {"type": "object", "properties": {"city": {"type": "string"}},
                                                   "required": ["city"]}),
         Tool("get_time", "The time", {"type": "object", "properties": {}})]
LEADING = sorted(n for n, f in FORMATS.items() if f.lead_prose)
OTHERS = sorted(set(FORMATS) - set(LEADING))


@pytest.fixture(scope="module")
def guidance(smollm2_tokenizer_dir: Path) -> Guidance:
    import json

    tok = json.loads((smollm2_tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    return Guidance(smollm2_tokenizer_dir / "tokenizer.json", len(tok["model"]["vocab"]) + len(tok["added_tokens"]),
                    (2,))


def accepts(g: Guidance, grammar: str, text: str) -> bool:
    guide = g.guide(Constraint("grammar", grammar, "tools"))
    return all(guide.matcher.consume_token(t) for t in g.tokenizer.tokenize_str(text)) and guide.matcher.is_accepting()


def calls_of(name: str, *pairs: tuple[str, str]) -> str:
    return FORMATS[name].calls_text(list(pairs))


def test_which_syntaxes_take_prose_first() -> None:
    assert LEADING == ["gemma", "hermes", "mistral", "phi4"] and OTHERS == ["llama3_json", "mistral_v11"]
    # a marker that is one special token in the model's vocabulary is dropped by the decoder: no prose first
    assert not FORMATS["mistral"].bind({"[TOOL_CALLS]": 5}).lead_prose
    assert not FORMATS["phi4"].bind({"<|tool_call|>": 7, "<|/tool_call|>": 8}).lead_prose


@pytest.mark.parametrize("name", LEADING)
def test_the_auto_grammar_allows_prose_then_calls(guidance: Guidance, name: str) -> None:
    fmt = FORMATS[name]
    grammar = fmt.grammar(TOOLS, "auto") or ""
    assert grammar.splitlines()[0] == f"{TOOL_MARK} {name} {LEAD}"
    one = calls_of(name, ("get_weather", '{"city": "Paris"}'))
    two = calls_of(name, ("get_weather", '{"city": "Paris"}'), ("get_time", "{}"))
    for text in ("Sure, here is an answer.", one, two, "Let me check.\n" + one, "Checking both.\n\n" + two,
                 "<b>not a call</b> " + one, "I think " + fmt.opener[:-1] + " is how calls start."):
        assert accepts(guidance, grammar, text), text
    for text in ("Look: " + fmt.opener + " is how calls start.", "Let me check.\n" + one + "\nDone."):
        assert not accepts(guidance, grammar, text), text  # the marker only begins calls; nothing after them
    required = fmt.grammar(TOOLS, "required") or ""
    assert not accepts(guidance, required, "Let me check.\n" + one) and accepts(guidance, required, one)


@pytest.mark.parametrize("name", OTHERS)
def test_syntaxes_without_a_visible_marker_keep_prose_or_calls(guidance: Guidance, name: str) -> None:
    grammar = FORMATS[name].grammar(TOOLS, "auto") or ""
    assert LEAD not in grammar.splitlines()[0].split()
    one = calls_of(name, ("get_weather", '{"city": "Paris"}'))
    assert accepts(guidance, grammar, one) and accepts(guidance, grammar, "Sure, here is an answer.")
    text = "Let me check.\n" + one  # allowed as prose, and then it is read as prose: no call comes of it
    parser = ToolCallParser(FORMATS[name])
    parser.feed(text)
    parser.finish()
    assert not parser.calls and parser.content == text


@pytest.mark.parametrize("name", LEADING)
@pytest.mark.parametrize("cut", [1, 2, 3, 5, 8, 1000])
def test_the_parser_splits_prose_from_calls_wherever_the_text_is_cut(name: str, cut: int) -> None:
    one = calls_of(name, ("get_weather", '{"city": "Paris"}'), ("get_time", "{}"))
    for prose, content in (("Let me check <both>.\n", "Let me check <both>.\n"), ("\n\n", ""), ("", "")):
        text = prose + one
        parser = ToolCallParser(FORMATS[name])
        deltas = [d for i in range(0, len(text), cut) for d in parser.feed(text[i:i + cut])] + parser.finish()
        assert parser.content == content == "".join(d.content for d in deltas if d.index < 0)
        assert [(c.name, c.arguments) for c in parser.calls] == [("get_weather", '{"city": "Paris"}'),
                                                                  ("get_time", "{}")]
        streamed = "".join(d.arguments for d in deltas if d.index == 0)
        assert streamed == '{"city": "Paris"}'
