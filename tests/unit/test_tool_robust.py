"""Answers that always parse, without a model: the tool-call parser drops repeats and unfinished
calls, and guides (engine/closing.py) close JSON within max_tokens, end a list of calls on a
repeat or when no other call fits, and cap whitespace. A "model" that picks uniformly random
allowed tokens is the adversary: it opens strings and objects at every chance."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from ortserve.engine.closing import WS_RUN, JsonScan, closing_path
from ortserve.engine.guidance import Constraint, Guidance, Guide, allocate_masks, apply_mask, constraint_of
from ortserve.engine.tools import TOOL_MARK, ToolCallParser, call_text, parse_tools, tool_grammar
from ortserve.types import SamplingParams

EOS = 0
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
STRICT = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
                                           "days": {"type": "array", "items": {"type": "integer"}}},
          "required": ["city", "unit", "days"], "additionalProperties": False}


@pytest.fixture(scope="module")
def guidance(tmp_path_factory: pytest.TempPathFactory) -> Guidance:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ['{"city": "Paris"}', "<tool_call>\n", '{"name": "get_weather", "arguments": ', "hello world",
            '"}', '"]', "}}", "null", "false", "true", '""', "    ", "\n\n"] * 20
    tok.train_from_iterator(text, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    g = Guidance(path, tok.get_vocab_size(), (EOS,))
    g.raw = tok  # type: ignore[attr-defined]
    return g


def _ids(g: Guidance, text: str) -> list[int]:
    return list(g.raw.encode(text).ids)  # type: ignore[attr-defined]


def _text(g: Guidance, ids: list[int]) -> str:
    return str(g.raw.decode(ids))  # type: ignore[attr-defined]


def _walk(g: Guidance, guide: Guide, max_tokens: int, seed: int, script: list[int] | None = None
          ) -> tuple[list[int], str]:
    """Generate as the engine does (mask, pick, consume, stop checks); random allowed tokens, or
    ``script``'s tokens while they last (each must be allowed)."""
    rng = np.random.default_rng(seed)
    mask = allocate_masks(1, g.vocab_size)[0]
    out: list[int] = []
    while True:
        guide.compute_mask(mask)
        logits = rng.standard_normal(g.vocab_size).astype(np.float32)
        apply_mask(logits, mask)
        token = int(np.argmax(logits))
        if script and len(out) < len(script):
            want = script[len(out)]
            if not np.isfinite(logits[want]):
                return out, "refused"
            token = want
        if token == EOS:
            return out, "stop"
        guide.consume(token)
        out.append(token)
        if guide.stopped:
            return out, guide.finish_reason
        if len(out) >= max_tokens:
            return out, "length"


# ---- the parser ---------------------------------------------------------------------------
def test_a_repeated_call_is_dropped_and_never_streamed() -> None:
    call = call_text("get_weather", '{"city": "Paris"}')
    p = ToolCallParser()
    pieces = [d for ch in call + "\n" + call + "\n" + call for d in p.feed(ch)] + p.finish()
    assert [c.arguments for c in p.calls] == ['{"city": "Paris"}'] and p.repeated
    assert len(p.dropped) == 1 and p.dropped[0].arguments == '{"city": "Paris"}'
    assert [d.index for d in pieces if d.call] == [0] and {d.index for d in pieces} == {0}
    assert "".join(d.arguments for d in pieces) == '{"city": "Paris"}'


def test_a_call_that_differs_late_is_streamed_whole() -> None:
    first, second = '{"city": "Paris"}', '{"city": "Paris, TX"}'
    p = ToolCallParser()
    text = call_text("get_weather", first) + "\n" + call_text("get_weather", second)
    pieces = [d for ch in text for d in p.feed(ch)] + p.finish()
    assert [c.arguments for c in p.calls] == [first, second] and not p.repeated and not p.dropped
    assert "".join(d.arguments for d in pieces if d.index == 1) == second
    assert [d.index for d in pieces if d.call] == [0, 1]


def test_an_unfinished_call_is_dropped_at_finish() -> None:
    p = ToolCallParser()
    done = call_text("get_weather", '{"city": "Paris"}')
    p.feed(done + "\n" + call_text("get_time", '{"tz": "Europe/Par')[:-len('"}\n</tool_call>')])
    p.finish()
    assert [c.name for c in p.calls] == ["get_weather"] and [c.name for c in p.dropped] == ["get_time"]
    # one that still read like an earlier call was never streamed at all
    q = ToolCallParser()
    pieces = q.feed(done + "\n" + done[:-len('aris"}}\n</tool_call>')]) + q.finish()
    assert len(q.calls) == 1 and len(q.dropped) == 1 and {d.index for d in pieces} == {0}


# ---- closing JSON -------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "cost"), [('{"a": "x', 2), ('{"a', 4), ('{"a": [1, {"b": ', 4), ('{"a": 1, ', 5),
                                            ('{"a": "}\\"', 2), ("", 0)])
def test_scan_estimates_what_closes_the_text(text: str, cost: int) -> None:
    assert JsonScan().feed(text).cost() == cost


@pytest.mark.parametrize("schema", [{"type": "object"}, STRICT])
@pytest.mark.parametrize("prefix", ['{"city": "Pa', '{"ci', '{"city": "Paris", "unit": "cel',
                                    '{"city": "x", "unit": "celsius", "days": [1, 2'])
def test_closing_path_completes_any_prefix(guidance: Guidance, schema: dict, prefix: str) -> None:
    guide = guidance.guide(Constraint.json_schema(schema))
    ids = _ids(guidance, prefix)
    if not guide.matcher.consume_tokens(ids):
        pytest.skip("not a prefix this schema allows")
    path = closing_path(guide.matcher, guidance.vocab, 40, JsonScan().feed(prefix))
    assert path is not None
    jsonschema.validate(json.loads(_text(guidance, ids + path)), schema)


@pytest.mark.parametrize(("schema", "max_tokens"), [({"type": "object"}, 8), ({"type": "object"}, 16),
                                                  ({"type": "object"}, 40), (STRICT, 40), (STRICT, 64)])
def test_random_json_always_parses_within_max_tokens(guidance: Guidance, schema: dict, max_tokens: int) -> None:
    """Whenever the budget can hold the shortest valid answer at all (STRICT needs about 30 of this
    tokenizer's tokens, most of them single bytes), the answer is complete."""
    forced = 0
    for seed in range(20):
        guide = guidance.guide(replace_max(Constraint.json_schema(schema), max_tokens))
        out, reason = _walk(guidance, guide, max_tokens, seed)
        assert len(out) <= max_tokens
        value = json.loads(_text(guidance, out))  # parses, whatever the random model wrote
        jsonschema.validate(value, schema)
        assert reason == "stop"   # complete: "length" is for content that was cut (the finish rule)
        forced += guide.policy.closed_early
    assert forced >= 10  # the random model rarely closes by itself: the budget did, and says "stop"


def replace_max(c: Constraint, max_tokens: int) -> Constraint:
    return Constraint(c.kind, c.text, c.param, max_tokens)


def test_max_tokens_reaches_the_guide_and_not_the_cache_key(guidance: Guidance) -> None:
    c = constraint_of(SamplingParams(json_schema={"type": "object"}, max_tokens=33))
    assert c is not None and c.max_tokens == 33
    assert c.key() == Constraint.json_schema({"type": "object"}, param="json_schema").key()
    guide = guidance.guide(c)
    assert guide.policy is not None and guide.policy.max_tokens == 33


def test_whitespace_runs_inside_json_are_capped(guidance: Guidance) -> None:
    guide = guidance.guide(replace_max(Constraint.json_schema({"type": "object"}), 200))
    blank = _ids(guidance, " " * (WS_RUN + 4))
    out, reason = _walk(guidance, guide, 200, 0, script=_ids(guidance, '{"a": "') + blank)
    assert reason == "refused"  # a whitespace-only token past the cap is masked out
    assert _text(guidance, out).endswith(" " * WS_RUN) and " " * (WS_RUN + 2) not in _text(guidance, out)


def test_whitespace_a_schema_allows_between_tokens_is_capped_too(guidance: Guidance) -> None:
    schema = {"type": "object", "x-guidance": {"whitespace_flexible": True}}
    guide = guidance.guide(replace_max(Constraint.json_schema(schema), 200))
    out, reason = _walk(guidance, guide, 200, 0, script=_ids(guidance, "{" + "\n" * (WS_RUN + 4)))
    assert reason == "refused" and _text(guidance, out).count("\n") in range(WS_RUN, WS_RUN + 2)


def test_json_without_a_budget_is_left_alone(guidance: Guidance) -> None:
    guide = guidance.guide(Constraint.json_schema({"type": "object"}))
    out, _ = _walk(guidance, guide, 30, 0)
    assert len(out) == 30  # no max_tokens given to the guide: nothing is closed early


# ---- lists of tool calls ------------------------------------------------------------------
def _tool_guide(g: Guidance, max_tokens: int, parallel: bool = True) -> Guide:
    grammar = tool_grammar(parse_tools([WEATHER]), "required", parallel) or ""
    assert grammar.startswith(TOOL_MARK)
    return g.guide(Constraint("grammar", grammar, "tools", max_tokens))


def test_a_repeated_call_ends_the_answer_with_stop(guidance: Guidance) -> None:
    call = call_text("get_weather", '{"city": "Paris"}')
    out, reason = _walk(guidance, _tool_guide(guidance, 500), 500, 0,
                        script=_ids(guidance, call + "\n" + call + "\n" + call))
    assert reason == "stop"
    text = _text(guidance, out)
    assert text.count("<tool_call>") == 2 and text.endswith('{"city": "Paris"}')  # ended as the repeat closed
    p = ToolCallParser()
    p.feed(text)
    p.finish()
    assert len(p.calls) == 1 and p.repeated


def test_no_call_starts_that_the_budget_cannot_hold(guidance: Guidance) -> None:
    call = call_text("get_weather", '{"city": "Paris"}')
    n = len(_ids(guidance, call))
    out, reason = _walk(guidance, _tool_guide(guidance, 2 * n), 2 * n, 0,
                        script=_ids(guidance, call + "\n" + call.replace("Paris", "Lyon")))
    assert reason == "refused" and _text(guidance, out) == call  # only the end was allowed after the first
    out, reason = _walk(guidance, _tool_guide(guidance, 2 * n + 8), 2 * n + 8, 0,
                        script=_ids(guidance, call + "\n" + call.replace("Paris", "Lyon")))
    assert _text(guidance, out) == call + "\n" + call.replace("Paris", "Lyon")  # room for two: both


def test_complete_arguments_without_room_for_the_tag_end_the_answer(guidance: Guidance) -> None:
    """Where the closing plan does not steer (``auto``: a call may be left out, docs/tools.md)."""
    call = call_text("get_weather", '{"city": "Paris"}')
    ids = _ids(guidance, call)
    tag = len(_ids(guidance, "}\n</tool_call>"))
    guide = _tool_guide(guidance, len(ids) - 2)
    guide.policy.must = False
    out, reason = _walk(guidance, guide, len(ids) - 2, 0, script=ids)
    assert reason == "stop" and _text(guidance, out).endswith('"Paris"}') and len(out) >= len(ids) - tag
    p = ToolCallParser()
    p.feed(_text(guidance, out))
    p.finish()
    assert [c.arguments for c in p.calls] == ['{"city": "Paris"}']  # the call stands: "tool_calls"


def test_random_tool_calls_parse_and_never_repeat(guidance: Guidance) -> None:
    for seed in range(20):
        out, reason = _walk(guidance, _tool_guide(guidance, 96), 96, seed)
        p = ToolCallParser()
        p.feed(_text(guidance, out))
        p.finish()
        for c in p.calls:
            jsonschema.validate(json.loads(c.arguments), WEATHER["function"]["parameters"])
        assert len({c.arguments for c in p.calls}) == len(p.calls)
        assert p.calls or reason == "length"


@pytest.mark.parametrize("max_tokens", [32, 48, 64])
def test_required_always_closes_a_call_within_the_budget(guidance: Guidance, max_tokens: int) -> None:
    """``required`` means a call: a random walk that wanders inside the arguments is closed in time
    (issue 46), where it used to run out of tokens with no call at all."""
    c = Constraint("grammar", tool_grammar(parse_tools([WEATHER]), "required", True) or "", "tools")
    need = guidance.shortest(c)
    assert need is not None and need <= 32   # the envelope, the name and {"city": ""}
    for seed in range(10):
        out, reason = _walk(guidance, _tool_guide(guidance, max_tokens), max_tokens, seed)
        p = ToolCallParser()
        p.feed(_text(guidance, out))
        p.finish()
        assert p.calls and reason == "stop" and len(out) <= max_tokens, _text(guidance, out)
        jsonschema.validate(json.loads(p.calls[0].arguments), WEATHER["function"]["parameters"])


def test_parallel_false_allows_exactly_one_call(guidance: Guidance) -> None:
    call = call_text("get_weather", '{"city": "Paris"}')
    out, reason = _walk(guidance, _tool_guide(guidance, 200, parallel=False), 200, 0,
                        script=_ids(guidance, call + "\n" + call.replace("Paris", "Lyon")))
    assert _text(guidance, out) == call and reason in ("stop", "refused")


def _auto_guide(g: Guidance, max_tokens: int) -> Guide:
    grammar = tool_grammar(parse_tools([WEATHER]), "auto") or ""
    assert grammar.startswith(TOOL_MARK) and grammar.splitlines()[0].endswith(" hermes lead")
    return g.guide(Constraint("grammar", grammar, "tools", max_tokens))


def test_prose_before_the_calls_does_not_count_as_a_calls_length(guidance: Guidance) -> None:
    """Under auto, "hello world ..." then two calls: the second fits a budget sized for the calls
    alone plus the prose, because the first call's length is measured from its marker."""
    call, prose = call_text("get_weather", '{"city": "Paris"}'), "hello world " * 6
    n, p = len(_ids(guidance, call)), len(_ids(guidance, prose))
    script = _ids(guidance, prose + call + "\n" + call.replace("Paris", "Lyon"))
    out, _ = _walk(guidance, _auto_guide(guidance, p + 2 * n + 8), p + 2 * n + 8, 0, script=script)
    assert _text(guidance, out) == prose + call + "\n" + call.replace("Paris", "Lyon")
    parser = ToolCallParser()
    parser.feed(_text(guidance, out))
    parser.finish()
    assert parser.content == prose and [c.arguments for c in parser.calls] == ['{"city": "Paris"}', '{"city": "Lyon"}']
