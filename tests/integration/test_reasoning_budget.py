r"""Reasoning budgets on a served thinking model, through the openai, anthropic and ollama clients
(engine/reasoning.py ``ThinkBudget``, docs/reasoning.md).

The model is a real ONNX model whose weights write a fixed text (tests/scripted.py) with Qwen3's real
chat template and ``<think>``/``</think>`` as added tokens: ``<think>`` then ``N`` words (140 tokens of
reasoning), ``</think>``, "\n\n" and "It is noon!". Each token's successor is fixed, so when the engine
forces ``</think>`` after N reasoning tokens the model goes on from there with "\n\n" and its answer:
a budget of N gives exactly N reasoning tokens and the same answer, and a missing budget all 140."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import ollama
import pytest
from openai import BadRequestError, OpenAI
from scripted import build
from servers import ServerThread

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llamacpp import template

N = 140  # reasoning tokens the model writes when nothing stops it
ASK = [{"role": "user", "content": "What time is it?"}]
ANSWER = "It is noon!"


def words(tokenizer_dir: Path, n: int) -> list[str]:
    """``n`` distinct words that are one token each (" apple"), none of the answer's."""
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    out: list[str] = []
    for piece, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]):
        text = tok.convert_tokens_to_string([piece])
        if (text.startswith(" ") and text[1:].isalpha() and text[1:].islower() and len(text) > 3
                and text not in (" is", " noon") and tok.tokenize(text) == [piece]):
            out.append(text)
            if len(out) == n:
                return out
    raise AssertionError("not enough one-token words")


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer_dir: Path) -> Iterator[ServerThread]:
    chain = ["<think>", *words(smollm2_tokenizer_dir, N), "</think>", "\n\n", "It", " is", " noon", "!", "<|im_end|>"]
    model = build(tmp_path_factory.mktemp("long-thinker"), smollm2_tokenizer_dir, chain,
                  added=("<think>", "</think>"), template=template("Qwen-Qwen3-0.6B"), starts=("\n\n",))
    with ServerThread(model, model_id="thinker") as s:
        yield s


@pytest.fixture(scope="module")
def oai(srv: ServerThread) -> OpenAI:
    return OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)


def chat(oai: OpenAI, **kw: Any) -> tuple[str, str, int, str]:
    """(reasoning, answer, reasoning_tokens, finish_reason) of a greedy chat."""
    r = oai.chat.completions.create(model="thinker", messages=ASK, max_tokens=N + 20, temperature=0,  # type: ignore[call-overload]
                                    **kw)
    msg = r.choices[0].message
    assert r.usage is not None and r.usage.completion_tokens_details is not None
    return ((msg.model_extra or {}).get("reasoning_content") or "", msg.content or "",
            r.usage.completion_tokens_details.reasoning_tokens or 0, r.choices[0].finish_reason)


def test_the_model_reasons_to_the_end_without_a_budget(oai: OpenAI) -> None:
    reasoning, answer, used, finish = chat(oai)
    assert used == N and len(reasoning.split()) == N and answer == ANSWER and finish == "stop"


@pytest.mark.parametrize("field,value,budget", [
    ("thinking_token_budget", 1, 1),                      # vLLM's name
    ("thinking_token_budget", 0, 0),                      # closed as soon as it opens
    ("chat_template_kwargs", {"thinking_budget": 5}, 5),  # SGLang's, as a template variable
    ("reasoning_effort", "minimal", 128),                 # the level's documented budget
])
def test_chat_budgets_close_the_reasoning_and_the_answer_follows(oai: OpenAI, field: str, value: Any,
                                                                 budget: int) -> None:
    kw = {"reasoning_effort": value} if field == "reasoning_effort" else {"extra_body": {field: value}}
    reasoning, answer, used, finish = chat(oai, **kw)
    assert used == budget and len(reasoning.split()) == budget
    assert answer == ANSWER and finish == "stop"


def test_a_streamed_chat_is_bounded_the_same(oai: OpenAI) -> None:
    thought, text, usage = [], [], None
    for chunk in oai.chat.completions.create(model="thinker", messages=ASK, max_tokens=N + 20, stream=True,  # type: ignore[call-overload]
                                             stream_options={"include_usage": True}, extra_body={"thinking_token_budget": 3}):
        usage = chunk.usage or usage
        for c in chunk.choices:
            thought.append((c.delta.model_extra or {}).get("reasoning_content") or "")
            text.append(c.delta.content or "")
    assert len("".join(thought).split()) == 3 and "".join(text) == ANSWER
    assert usage is not None and usage.completion_tokens_details.reasoning_tokens == 3


def test_thinking_off_and_a_budget_beyond_max_tokens(oai: OpenAI) -> None:
    """enable_thinking false: no block at all; a budget max_tokens cuts first: all reasoning, cut ("length")."""
    reasoning, answer, used, _ = chat(oai, extra_body={"chat_template_kwargs": {"enable_thinking": False,
                                                                                "thinking_budget": 4}})
    assert (reasoning, answer, used) == ("", ANSWER, 0)
    r = oai.chat.completions.create(model="thinker", messages=ASK, max_tokens=8,  # type: ignore[arg-type]
                                    extra_body={"thinking_token_budget": 100})
    assert r.choices[0].finish_reason == "length" and not r.choices[0].message.content


def test_bad_budgets_are_400s_naming_the_field(oai: OpenAI) -> None:
    for body, param in (({"thinking_token_budget": -1}, "thinking_token_budget"),
                        ({"chat_template_kwargs": {"thinking_budget": "lots"}}, "chat_template_kwargs.thinking_budget")):
        with pytest.raises(BadRequestError) as err:
            oai.chat.completions.create(model="thinker", messages=ASK, max_tokens=4, extra_body=body)  # type: ignore[arg-type]
        assert param in str(err.value.body)


def test_responses_effort_bounds_the_reasoning_item(oai: OpenAI) -> None:
    r = oai.responses.create(model="thinker", input="What time is it?", max_output_tokens=N + 20,
                             temperature=0, reasoning={"effort": "minimal"})
    assert [o.type for o in r.output] == ["reasoning", "message"] and r.output_text == ANSWER
    assert len(r.output[0].content[0].text.split()) == 128  # type: ignore[union-attr,index]
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens == 128
    with pytest.raises(BadRequestError) as err:
        oai.responses.create(model="thinker", input="hi", max_output_tokens=4, reasoning={"effort": "extreme"})
    assert err.value.body["param"] == "reasoning.effort"  # type: ignore[index]


@pytest.mark.parametrize("stream", [False, True])
def test_messages_budget_tokens_bound_the_thinking_block(srv: ServerThread, stream: bool) -> None:
    claude = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0, timeout=120)
    kw: dict[str, Any] = {"model": "thinker", "max_tokens": N + 20, "messages": ASK,
                          "thinking": {"type": "enabled", "budget_tokens": 4}}
    if stream:
        with claude.messages.stream(**kw) as s:
            m = s.get_final_message()
    else:
        m = claude.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"] and m.content[1].text == ANSWER  # type: ignore[union-attr]
    assert len(m.content[0].thinking.split()) == 4 and m.stop_reason == "end_turn"  # type: ignore[union-attr]


def test_ollama_think_levels_and_switch(srv: ServerThread) -> None:
    client = ollama.Client(host=srv.url, timeout=120)
    options = {"temperature": 0, "num_predict": N + 20}
    low = client.chat(model="thinker", messages=ASK, think="low", options=options)  # 512: more than it writes
    assert len((low.message.thinking or "").split()) == N and low.message.content == ANSWER
    full = client.chat(model="thinker", messages=ASK, think=True, options=options)
    assert len((full.message.thinking or "").split()) == N and full.message.content == ANSWER
    off = client.chat(model="thinker", messages=ASK, think=False, options=options)
    assert not off.message.thinking and off.message.content == ANSWER


def test_a_model_that_does_not_think(tiny_model: Path) -> None:
    """Messages ``thinking.type: enabled`` is a 400 naming the field (as Anthropic's API on such a model,
    and as Ollama's ``think``); an OpenAI budget or effort has nothing to bound: the same answer, 0
    reasoning tokens."""
    with ServerThread(tiny_model, model_id="plain") as s:
        claude = anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0, timeout=120)
        with pytest.raises(anthropic.BadRequestError) as err:
            claude.messages.create(model="plain", max_tokens=8, messages=ASK,  # type: ignore[arg-type]
                                   thinking={"type": "enabled", "budget_tokens": 1024})
        assert "thinking.type" in str(err.value.body)
        client = OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=120)
        plain, bounded = (client.chat.completions.create(model="plain", messages=ASK, max_tokens=6, temperature=0,  # type: ignore[call-overload]
                                                         **kw) for kw in ({}, {"extra_body": {"thinking_token_budget": 1}}))
        assert bounded.choices[0].message.content == plain.choices[0].message.content
        assert bounded.usage.completion_tokens_details.reasoning_tokens == 0
