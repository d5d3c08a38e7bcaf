"""Thinking models' output split into reasoning and answer (engine/reasoning.py), however the text is
cut; Qwen's marker tokens in the tool grammar (a grammar's text cannot write an added token, so the
grammar names them), with Qwen3's real template and Qwen's ``<tool_call>``/``<think>`` added the way
Qwen's vocabulary has them (added tokens that are not special)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from ortserve.engine.formats import ToolCallParser
from ortserve.engine.guidance import Constraint, Guidance
from ortserve.engine.reasoning import MISTRAL, ReasoningSplitter, left_open, markers_of, thinks
from ortserve.engine.tokenizer import TextCodec
from ortserve.engine.tools import parse_tools

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llamacpp import template

CASES = [  # (generated text, prompt opened the block, reasoning, answer)
    ("<think>\nPlan it.\nStep two.\n</think>\n\nIt is noon!", False, "Plan it.\nStep two.", "It is noon!"),
    ("\nPlan it.\n</think>\n\nIt is noon!", True, "Plan it.", "It is noon!"),
    ("It is noon!", False, "", "It is noon!"),
    ("  <thinking> is not the marker", False, "", "  <thinking> is not the marker"),
    ("<think>\ncut off by max_tokens", False, "cut off by max_tokens", ""),
    ("<think>\n\n</think>\n\nAnswer <think> later stays", False, "", "Answer <think> later stays"),
    ("</think>no reasoning", True, "", "no reasoning"),
]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.mark.parametrize("text,inside,reasoning,answer", CASES)
@pytest.mark.parametrize("cut", [1, 2, 3, 7, 1000])
def test_reasoning_and_answer_wherever_the_text_is_cut(text: str, inside: bool, reasoning: str, answer: str,
                                                       cut: int) -> None:
    s = ReasoningSplitter(inside)
    pieces = [p for i in range(0, len(text), cut) for p in s.feed(text[i:i + cut])] + s.finish()
    assert "".join(t for r, t in pieces if r) == s.reasoning == reasoning
    assert "".join(t for r, t in pieces if not r) == s.content == answer


def test_which_templates_think() -> None:
    assert thinks(template("Qwen-Qwen3-0.6B")) and thinks(template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"))
    assert not thinks(template("Qwen-Qwen2.5-7B-Instruct")) and not thinks(None)
    assert markers_of(template("mistralai-Ministral-3-14B-Reasoning-2512")) == MISTRAL
    assert markers_of(template("Mistral-Small-3.2-24B-Instruct-2506")) is None
    assert left_open("<|im_start|>assistant\n<think>\n") and not left_open("<think>\n\n</think>\n\n")


@pytest.mark.parametrize("cut", [1, 2, 5, 1000])
def test_mistral_markers(cut: int) -> None:
    text = "[THINK]Plan it.[/THINK]It is noon!"
    s = ReasoningSplitter(False, MISTRAL)
    pieces = [p for i in range(0, len(text), cut) for p in s.feed(text[i:i + cut])] + s.finish()
    assert (s.reasoning, s.content) == ("Plan it.", "It is noon!") == (
        "".join(t for r, t in pieces if r), "".join(t for r, t in pieces if not r))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer_dir: Path) -> Path:
    """A model directory's tokenizer files: SmolLM2's vocabulary with Qwen's four markers added as Qwen's
    tokenizer.json has them (not special), and Qwen3's real chat template."""
    from tokenizers import AddedToken, Tokenizer

    out = tmp_path_factory.mktemp("qwen3-like")
    tok = Tokenizer.from_file(str(smollm2_tokenizer_dir / "tokenizer.json"))
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t in ("<tool_call>", "</tool_call>", "<think>", "</think>")])
    tok.save(str(out / "tokenizer.json"))
    shutil.copy(smollm2_tokenizer_dir / "tokenizer_config.json", out / "tokenizer_config.json")
    (out / "chat_template.jinja").write_text(template("Qwen-Qwen3-0.6B"), encoding="utf-8")
    return out


def test_qwen_markers_are_tokens_in_the_grammar_and_text_in_the_answer(qwen3_dir: Path) -> None:
    codec = TextCodec(qwen3_dir)
    fmt = codec.tool_format
    ids = {m: codec.token_id(m) for m in ("<tool_call>", "</tool_call>", "<think>", "</think>")}
    assert fmt.name == "hermes" and dict(fmt.specials) == {m: ids[m] for m in ("<tool_call>", "</tool_call>")}
    assert fmt.dropped == () and fmt.lead_prose  # the decoder keeps them: the parser sees where calls begin
    grammar = fmt.grammar(parse_tools([WEATHER]), "auto", think=codec.think_lark()) or ""
    assert f"<[{ids['<tool_call>']}]>" in grammar and f"<[{ids['<think>']}]> THOUGHT <[{ids['</think>']}]>" in grammar
    vocab = json.loads((qwen3_dir / "tokenizer.json").read_text(encoding="utf-8"))
    g = Guidance(qwen3_dir / "tokenizer.json", len(vocab["model"]["vocab"]) + len(vocab["added_tokens"]), (2,))

    def accepts(text: str) -> bool:
        guide = g.guide(Constraint("grammar", grammar, "tools"))
        return all(guide.matcher.consume_token(t) for t in codec.encode(text, add_special_tokens=False)) \
            and guide.matcher.is_accepting()

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    for text in ("<think>\nPlan.\n</think>\n\n" + call, "<think>\nPlan.\n</think>\n\nIt is noon.", "Sure.\n" + call,
                 call, "It is noon."):
        assert accepts(text), text
        s = ReasoningSplitter(codec.answer_starts_thinking())
        s.feed(codec.decode(codec.encode(text, add_special_tokens=False)))
        s.finish()
        p = ToolCallParser(fmt)
        p.feed(s.content)
        p.finish()
        assert [c.arguments for c in p.calls] == (['{"city": "Paris"}'] if call in text else [])
        assert s.reasoning == ("Plan." if "<think>" in text else "")
    # the markers written out in ordinary tokens are not the trained tokens: the grammar refuses them
    spelled = [t for piece in ("<", "tool", "_", "call", ">") for t in codec.encode(piece, add_special_tokens=False)]
    guide = g.guide(Constraint("grammar", grammar, "tools"))
    assert not all(guide.matcher.consume_token(t) for t in spelled + codec.encode("\n{", add_special_tokens=False))
    # thinking off: the template closed an empty block, and the grammar has no room for another
    assert codec.think_lark(False) is None and not codec.answer_starts_thinking(False)


def test_reasoning_sent_back_reaches_the_turn_it_came_with() -> None:
    """Responses reasoning items and Messages thinking blocks become the assistant turn's
    reasoning_content (what a thinking model's template writes back); encrypted ones have no text."""
    from ortserve.server.api.anthropic_messages import MessagesRequest
    from ortserve.server.api.anthropic_messages import messages_of as anthropic_messages
    from ortserve.server.api.responses_input import messages_of as responses_messages

    out = responses_messages([
        {"type": "message", "role": "user", "content": "What time is it?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Plan."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "noon"},
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "opaque"},
        {"type": "message", "role": "assistant", "content": "It is noon."}])
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "assistant"]
    assert out[1] == {"role": "assistant", "content": "Checking.", "reasoning_content": "Plan.",
                      "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
    assert "reasoning_content" not in out[3]
    body = MessagesRequest(model="m", max_tokens=8, messages=[
        {"role": "user", "content": "What time is it?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Plan.", "signature": ""},
                                          {"type": "redacted_thinking", "data": "opaque"},
                                          {"type": "text", "text": "It is noon."}]}])
    assert anthropic_messages(body)[1] == {"role": "assistant", "content": "It is noon.", "reasoning_content": "Plan."}
