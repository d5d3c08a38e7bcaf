"""Each family's tool-call grammar on its REAL tokenizer (llama.cpp's vocab GGUFs): random logits
under the llguidance mask stand for a model that writes anything the grammar allows; what it writes
is a well-formed call list in that family's syntax, and the parser reads back the same calls,
whole and streamed token by token (the engine's incremental detokenizer, special tokens skipped)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from grammar_walk import random_completion
from vocab_tokenizers import tokenizer_dir

from ortserve.engine.detokenize import IncrementalDetokenizer
from ortserve.engine.formats import FORMATS, ToolCallParser
from ortserve.engine.guidance import Guidance
from ortserve.engine.tools import parse_tools

TOOLS = parse_tools([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "required": ["city", "days", "unit"], "properties": {
            "city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 9},
            "unit": {"enum": ["c", "f"]}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
])
# (syntax, the real vocabulary it is tested on): each family on its own tokenizer; Mistral's tekken
# vocabularies are not in llama.cpp's set, so both Mistral syntaxes run on the Llama/Mistral 7B SPM one
PAIRS = [("llama3_json", "llama-bpe"), ("hermes", "qwen2"), ("hermes", "phi-3"), ("phi4", "phi-3"),
         ("gemma", "gemma-4"), ("mistral", "llama-spm"), ("mistral_v11", "llama-spm")]
_GUIDANCE: dict[str, tuple[Guidance, object]] = {}


def guidance_for(vocab: str) -> tuple[Guidance, object]:
    if vocab not in _GUIDANCE:
        from tokenizers import Tokenizer

        d = tokenizer_dir(vocab)
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        eos = json.loads((d / "tokenizer_config.json").read_text())["eos_token"]
        eos = eos["content"] if isinstance(eos, dict) else eos
        _GUIDANCE[vocab] = (Guidance(d / "tokenizer.json", tok.get_vocab_size(), (tok.token_to_id(eos),)), tok)
    return _GUIDANCE[vocab]


def write(guidance: Guidance, grammar: str, seed: int, budget: int = 300) -> list[int]:
    """A random but grammar-valid completion: the argmax of random logits under the mask."""
    ids, _ = random_completion(guidance, grammar, seed, budget)
    assert len(ids) < budget, "the grammar never let the list end"
    return ids


@pytest.mark.parametrize(("fmt_name", "vocab"), PAIRS)
def test_grammar_forces_the_family_syntax_and_parses_back(fmt_name: str, vocab: str) -> None:
    fmt = FORMATS[fmt_name]
    guidance, tok = guidance_for(vocab)
    for mode, seed in [("required", 1), ("required", 2), ("required", 3), ("get_weather", 4)]:
        grammar = fmt.grammar(TOOLS, mode, parallel=True) or ""
        ids = write(guidance, grammar, seed)
        text = tok.decode(ids, skip_special_tokens=True)  # type: ignore[attr-defined]
        whole = ToolCallParser(fmt)
        whole.feed(text), whole.finish()
        assert whole.calls and whole.content == "", text
        # the text is exactly the family's envelope around these calls (a repeat ends the list at
        # its arguments' last brace and is dropped: the text is then the envelope up to there)
        envelope = fmt.calls_text([(c.name, c.arguments) for c in whole.calls + whole.dropped])
        assert envelope == text or (whole.repeated and envelope.startswith(text)), text
        for c in whole.calls:
            args = json.loads(c.arguments)
            if c.name == "get_weather":
                assert set(args) == {"city", "days", "unit"} and 1 <= args["days"] <= 9 and args["unit"] in "cf"
                assert len(args["city"]) <= 12
            else:
                assert mode == "required" and c.name == "get_time" and args == {}
        streamed, detok = ToolCallParser(fmt), IncrementalDetokenizer(
            lambda xs: tok.decode(xs, skip_special_tokens=True))  # type: ignore[attr-defined]
        args: dict[int, str] = {}
        for t in ids:
            for d in streamed.feed(detok.push(t)):
                if d.index >= 0:
                    args[d.index] = args.get(d.index, "") + d.arguments
        for d in streamed.feed(detok.flush()) + streamed.finish():
            if d.index >= 0:
                args[d.index] = args.get(d.index, "") + d.arguments
        assert [(c.name, c.arguments) for c in streamed.calls] == [(c.name, c.arguments) for c in whole.calls]
        assert args == {i: c.arguments for i, c in enumerate(whole.calls)}


def test_a_model_dir_picks_its_format_from_template_and_manifest(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    import shutil

    from llamacpp import template

    from ortserve.engine.tokenizer import TextCodec
    from ortserve.errors import ModelError

    d = tmp_path / "model"
    shutil.copytree(tokenizer_dir("phi-3"), d)
    assert TextCodec(d).tool_format.name == "hermes"  # no template: the fallback
    (d / "chat_template.jinja").write_text(template("meta-llama-Llama-3.1-8B-Instruct"), encoding="utf-8")
    assert TextCodec(d).tool_format.name == "llama3_json"
    (d / "ortserve.json").write_text(json.dumps({"tool_format": "hermes"}), encoding="utf-8")
    with caplog.at_level("INFO", logger="ortserve.engine"):
        assert TextCodec(d).tool_format.name == "hermes"  # the manifest wins
    assert "model: tool calls in the hermes syntax (from its manifest)" in caplog.text
    (d / "ortserve.json").write_text(json.dumps({"tool_format": "llama4"}), encoding="utf-8")
    with pytest.raises(ModelError, match=r"tool_format.*hermes, mistral_v11, mistral, phi4, llama3_json, gemma"):
        TextCodec(d)


def test_a_marker_that_is_one_special_token_is_written_as_that_token() -> None:
    """Mistral's ``[TOOL_CALLS]`` bound to a special token of a real vocabulary (llama-bpe's
    reserved id 128010 stands in: no Mistral tekken vocab is in llama.cpp's set): the grammar asks
    for that one token, and the calls parse back from text with and without its spelling."""
    guidance, tok = guidance_for("llama-bpe")
    fmt = FORMATS["mistral"].bind({"[TOOL_CALLS]": 128010, "<|eot_id|>": 128009})
    grammar = fmt.grammar(TOOLS, "get_weather") or ""
    assert "<[128010]>" in grammar and '"[TOOL_CALLS]' not in grammar
    ids = write(guidance, grammar, seed=5)
    assert ids[0] == 128010 and 128010 not in ids[1:]
    for skip in (True, False):
        text = tok.decode(ids, skip_special_tokens=skip)  # type: ignore[attr-defined]
        if not skip:
            text = text.replace("<|reserved_special_token_5|>", "[TOOL_CALLS]")  # the stand-in's own name
        p = ToolCallParser(fmt)
        p.feed(text), p.finish()
        assert [c.name for c in p.calls] == ["get_weather"] and p.content == "", text


def test_a_v11_model_dir_binds_its_markers_and_reads_calls_without_them(tmp_path: Path) -> None:
    """A v11 model directory: the real SPM vocabulary with [TOOL_CALLS], [ARGS] and [CALL_ID] added as
    special tokens (as in Mistral's v11 vocabularies) and Mistral Small 3.2's real template. The model
    is detected as mistral_v11, the grammar asks for the markers' own tokens, and what it writes parses
    back from the server's decoding (special tokens skipped: no marker text left)."""
    import shutil

    from llamacpp import template
    from tokenizers import AddedToken, Tokenizer

    from ortserve.engine.tokenizer import TextCodec

    d = tmp_path / "model"
    shutil.copytree(tokenizer_dir("llama-spm"), d)
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in ("[TOOL_CALLS]", "[ARGS]",
                                                                                   "[CALL_ID]")])
    tok.save(str(d / "tokenizer.json"))
    (d / "chat_template.jinja").write_text(template("Mistral-Small-3.2-24B-Instruct-2506"), encoding="utf-8")
    codec = TextCodec(d)
    fmt = codec.tool_format
    marks = {m: tok.token_to_id(m) for m in ("[TOOL_CALLS]", "[ARGS]")}
    assert fmt.name == "mistral_v11" and dict(fmt.specials) == marks
    eos = json.loads((d / "tokenizer_config.json").read_text())["eos_token"]
    eos = eos["content"] if isinstance(eos, dict) else eos
    guidance = Guidance(d / "tokenizer.json", tok.get_vocab_size(), (tok.token_to_id(eos),))
    for mode, seed in [("required", 11), ("required", 12), ("get_weather", 13)]:
        ids = write(guidance, fmt.grammar(TOOLS, mode) or "", seed)
        assert ids[0] == marks["[TOOL_CALLS]"] and marks["[ARGS]"] in ids
        text = codec.decode(ids)  # the server's decoding: special tokens skipped
        assert "[TOOL_CALLS]" not in text and "[ARGS]" not in text
        p = ToolCallParser(fmt)
        p.feed(text), p.finish()
        spelled = ToolCallParser(fmt)
        spelled.feed(tok.decode(ids, skip_special_tokens=False)), spelled.finish()
        assert p.calls and p.content == "" and [(c.name, c.arguments) for c in p.calls] == [
            (c.name, c.arguments) for c in spelled.calls]
        assert all(c.name in ("get_weather", "get_time") and isinstance(json.loads(c.arguments), dict)
                   for c in p.calls)
