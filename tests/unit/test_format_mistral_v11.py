"""Mistral v11's tool-call syntax (``[TOOL_CALLS]name[ARGS]{…}``): the grammar on a tokenizer whose
``[TOOL_CALLS]``, ``[ARGS]`` and ``[CALL_ID]`` are special tokens, as in a v11 vocabulary (a byte-level
BPE trained here in milliseconds stands in for tekken), and the parser reading back what that grammar
lets a model write, whole and token by token, with the markers decoded or dropped."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from grammar_walk import random_completion

from ortserve.engine.detokenize import IncrementalDetokenizer
from ortserve.engine.formats import FORMATS, ToolCallParser, ToolFormat
from ortserve.engine.guidance import Constraint, Guidance, allocate_masks, apply_mask
from ortserve.engine.tools import parse_tools

TOOLS = parse_tools([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "required": ["city", "unit"], "properties": {
            "city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
])
MARKERS = ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"]
EOS = 0
PARIS = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "c"}'
TIME = "[TOOL_CALLS]get_time[ARGS]{}"


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> tuple[Guidance, object, ToolFormat]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["</s>", *MARKERS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t.train_from_iterator(['get_weather{"city": "Paris", "unit": "c"}', "get_time{}", "hello world"] * 20, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    t.save(str(path))
    # what TextCodec binds a model's format with: its special tokens, text -> id
    specials = {a.content: i for i, a in t.get_added_tokens_decoder().items() if a.special}
    return Guidance(path, t.get_vocab_size(), (EOS,)), t, FORMATS["mistral_v11"].bind(specials)


def allowed(tok: tuple, grammar: str | None, text: str) -> bool:
    """Whether the grammar lets a model write ``text`` (its special markers as their tokens) and end."""
    guidance, t, _ = tok
    guide = guidance.guide(Constraint("grammar", grammar or ""))
    mask = allocate_masks(1, guidance.vocab_size)[0]
    for token in [*t.encode(text).ids, EOS]:
        guide.compute_mask(mask)
        logits = np.zeros(guidance.vocab_size, dtype=np.float32)
        apply_mask(logits, mask)
        if not np.isfinite(logits[token]):
            return False
        if token != EOS:
            guide.consume(token)
    return True


def test_markers_are_bound_to_their_special_tokens(tok: tuple) -> None:
    _, t, fmt = tok
    ids = {m: t.token_to_id(m) for m in MARKERS}
    grammar = fmt.grammar(TOOLS, "required") or ""
    assert f'<[{ids["[TOOL_CALLS]"]}]> "get_weather" <[{ids["[ARGS]"]}]> args_0' in grammar
    assert '"[TOOL_CALLS]' not in grammar and '[ARGS]"' not in grammar
    assert t.encode(PARIS).ids[0] == ids["[TOOL_CALLS]"]  # the test text really carries the special tokens


def test_grammar_modes(tok: tuple) -> None:
    fmt: ToolFormat = tok[2]
    required = fmt.grammar(TOOLS, "required")
    assert allowed(tok, required, PARIS) and allowed(tok, required, PARIS + TIME)
    assert not allowed(tok, required, "hello world")
    assert not allowed(tok, required, '[TOOL_CALLS][{"name": "get_time", "arguments": {}}]')  # Nemo's syntax
    assert not allowed(tok, required, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}')  # schema: unit required
    auto = fmt.grammar(TOOLS, "auto")
    assert allowed(tok, auto, PARIS) and allowed(tok, auto, "hello world") and allowed(tok, auto, "hello")
    # prose that a decoder skipping the markers could not tell from a call
    assert not allowed(tok, auto, 'get_time{}') and not allowed(tok, auto, "[x] hello")
    single = fmt.grammar(TOOLS, "required", parallel=False)
    assert allowed(tok, single, TIME) and not allowed(tok, single, PARIS + TIME)
    named = fmt.grammar(TOOLS, "get_time")
    assert allowed(tok, named, TIME) and not allowed(tok, named, PARIS) and not allowed(tok, named, "hello")
    assert fmt.grammar(TOOLS, "none") is None


@pytest.mark.parametrize("text", ["The weather is fine.", "hello", "Paris: 21 C", "a-b_c d{e}"])
def test_prose_the_auto_grammar_allows_is_read_as_prose(text: str) -> None:
    fmt = FORMATS["mistral_v11"]
    assert re.fullmatch(fmt.prose(), text)
    p = ToolCallParser(fmt)
    out = [d for ch in text for d in p.feed(ch)] + p.finish()
    assert p.content == text and not p.calls and "".join(d.content for d in out) == text


def write(tok: tuple, grammar: str, seed: int, budget: int = 200) -> tuple[list[int], object]:
    """A random but grammar-valid completion (the argmax of random logits under the mask) and its guide."""
    ids, guide = random_completion(tok[0], grammar, seed, budget)
    # prose (auto) may run to the budget; a list of calls always ends
    assert len(ids) < budget or not grammar.startswith("start: calls", grammar.find("\n") + 1), "no end"
    return ids, guide


def read(fmt: ToolFormat, t: object, ids: list[int], skip: bool) -> tuple[ToolCallParser, dict[int, str]]:
    """The calls in ``ids`` read whole (the parser) and streamed token by token (the arguments' pieces)."""
    whole = ToolCallParser(fmt)
    whole.feed(t.decode(ids, skip_special_tokens=skip)), whole.finish()  # type: ignore[attr-defined]
    streamed, detok = ToolCallParser(fmt), IncrementalDetokenizer(
        lambda xs: t.decode(xs, skip_special_tokens=skip))  # type: ignore[attr-defined]
    args: dict[int, str] = {}
    for d in [d for i in ids for d in streamed.feed(detok.push(i))] + streamed.feed(detok.flush()) + streamed.finish():
        if d.index >= 0:
            args[d.index] = args.get(d.index, "") + d.arguments
    assert [(c.name, c.arguments) for c in streamed.calls] == [(c.name, c.arguments) for c in whole.calls]
    assert args == {i: c.arguments for i, c in enumerate(whole.calls)}
    return whole, args


# seeds: auto 4 writes prose, auto 231 a call (its first token the special [TOOL_CALLS]), 1-3 and 5 calls
@pytest.mark.parametrize(("mode", "seed"), [("required", 1), ("required", 2), ("required", 3), ("auto", 4),
                                            ("auto", 231), ("get_weather", 5)])
def test_what_the_grammar_writes_parses_back_with_markers_kept_or_dropped(tok: tuple, mode: str, seed: int) -> None:
    _, t, fmt = tok
    ids, guide = write(tok, fmt.grammar(TOOLS, mode) or "", seed)
    kept = t.decode(ids, skip_special_tokens=False)  # type: ignore[attr-defined]
    whole, _ = read(fmt, t, ids, skip=False)
    dropped, _ = read(fmt, t, ids, skip=True)  # the server's decoder skips special tokens
    calls = [(c.name, c.arguments) for c in whole.calls]
    assert [(c.name, c.arguments) for c in dropped.calls] == calls and dropped.content == whole.content
    # the engine's policy (engine/closing.py, reading llguidance's text of each token) saw the same calls
    assert [(c.name, c.arguments) for c in guide.policy.parser.calls] == calls  # type: ignore[attr-defined]
    if whole.content:  # auto wrote prose: then there is no call, and the prose is all of it
        assert (mode, seed) == ("auto", 4) and not calls and whole.content == kept
        return
    assert calls and kept == fmt.calls_text(calls + [(c.name, c.arguments) for c in whole.dropped])
    for name, a in calls:
        parsed = json.loads(a)
        assert (set(parsed) == {"city", "unit"} and parsed["unit"] in "cf") if name == "get_weather" else parsed == {}


def test_parallel_calls_call_ids_and_repeats() -> None:
    fmt = FORMATS["mistral_v11"]
    p = ToolCallParser(fmt)
    text = '[TOOL_CALLS]a[CALL_ID]Ab3De5Gh7[ARGS]{"x": 1}[TOOL_CALLS]b[CALL_ID]Ab3De5Gh7[ARGS]{"y": [2]}'
    p.feed(text), p.finish()
    assert [(c.name, c.arguments) for c in p.calls] == [("a", '{"x": 1}'), ("b", '{"y": [2]}')]
    # the model's own id is kept; a second use of the same id gets a fresh one (ids stay unique)
    assert p.calls[0].id == "Ab3De5Gh7" and p.calls[1].id != "Ab3De5Gh7" and len(p.calls[1].id) == 9
    rep = ToolCallParser(fmt)
    rep.feed('a{"x": 1}b{}a{"x": 1}c{}'), rep.finish()  # markers dropped; the repeat of a ends the list
    assert rep.repeated and [(c.name, c.arguments) for c in rep.calls] == [("a", '{"x": 1}'), ("b", "{}")]
    cut = ToolCallParser(fmt)
    cut.feed('[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{"y": "unfin'), cut.finish()
    assert [c.name for c in cut.calls] == ["a"] and [c.name for c in cut.dropped] == ["b"]
