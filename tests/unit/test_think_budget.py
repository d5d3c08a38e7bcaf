"""The reasoning budget's decisions, model-free (engine/reasoning.py ``ThinkBudget``, the sampler's forced
token in engine/postprocess.py, and each wire API's fields as a budget). The end-to-end behaviour on a
served thinking model is in tests/integration/test_reasoning_budget.py."""

from __future__ import annotations

import numpy as np
import pytest

from ortserve.engine.detokenize import IncrementalDetokenizer
from ortserve.engine.postprocess import Postprocess
from ortserve.engine.reasoning import EFFORT_BUDGETS, MISTRAL, ThinkBudget, effort_budget
from ortserve.engine.sequence import Sequence
from ortserve.errors import InvalidRequest
from ortserve.server.api.anthropic_messages import MessagesRequest, _check, budget_of, thinking_of
from ortserve.server.api.ollama_wire import ChatRequest
from ortserve.server.protocol import ChatCompletionRequest
from ortserve.types import SamplingParams

VOCAB = ["<think>", "</think>", "\n\n", "a", " b", " c", " d", "It", " is", "</", "think", ">", "[THINK]", "[/THINK]", "\n"]
ID = {t: i for i, t in enumerate(VOCAB)}


def run(budget: ThinkBudget, wants: list[str], steps: int = 40) -> tuple[list[str], list[bool]]:
    """Generate as a bigram model that writes ``wants`` would (each token's successor is fixed, as in
    tests/scripted.py): each step takes the forced token if there is one, else the successor."""
    after = dict(zip(["(prompt)", *wants], wants, strict=False))
    out, forced, last = [], [], "(prompt)"
    for _ in range(steps):
        f = budget.forced()
        if f is None and last not in after:
            break
        last = VOCAB[f] if f is not None else after[last]
        budget.observe(ID[last])
        out.append(last)
        forced.append(f is not None)
    return out, forced


def make(budget: int, close: tuple[str, ...] = ("</think>",), markers: tuple[str, str] = ("<think>", "</think>"),
         inside: bool = False) -> ThinkBudget:
    return ThinkBudget(budget, [ID[t] for t in close], VOCAB.__getitem__, markers, inside)


LONG = ["<think>", "a", " b", " c", " d", "\n", "</think>", "\n\n", "It", " is"]


def test_the_block_is_closed_once_the_budget_is_spent_and_the_answer_goes_on() -> None:
    b = make(2)
    out, forced = run(b, LONG)
    assert out == ["<think>", "a", " b", "</think>", "\n\n", "It", " is"]
    assert forced == [False, False, False, True, False, False, False]
    assert b.used == 2 and b.closed_early and b.split.reasoning == "a b" and b.split.state == "answer"


def test_a_block_closed_within_the_budget_is_left_alone_and_counted() -> None:
    b = make(50)
    out, forced = run(b, LONG)
    assert out == LONG and not any(forced) and b.used == 5 and not b.closed_early


def test_budget_zero_closes_the_block_as_soon_as_it_opens() -> None:
    b = make(0)
    out, _ = run(b, LONG)
    assert out[:3] == ["<think>", "</think>", "\n\n"] and b.used == 0 and b.split.reasoning == ""


def test_minus_one_counts_without_a_bound() -> None:
    b = make(-1)
    out, forced = run(b, LONG)
    assert out == LONG and not any(forced) and b.used == 5


def test_an_answer_without_a_block_is_never_forced() -> None:
    b = make(0)
    out, forced = run(b, ["\n\n", "It", " is"])
    assert out == ["\n\n", "It", " is"] and not any(forced) and b.used == 0


def test_a_block_the_prompt_opened_counts_from_the_first_token() -> None:
    """DeepSeek-R1's template opens the block in the generation prompt."""
    b = make(3, inside=True)
    out, _ = run(b, LONG[1:])
    assert out[:5] == ["a", " b", " c", "</think>", "\n\n"] and b.used == 3


def test_a_close_marker_of_several_tokens_is_forced_token_by_token() -> None:
    b = make(1, close=("</", "think", ">"))
    out, forced = run(b, LONG)
    assert out[:5] == ["<think>", "a", "</", "think", ">"] and forced[2:5] == [True, True, True]
    assert b.used == 1 and b.closed_early and b.split.state != "inside"


def test_mistral_markers() -> None:
    b = make(1, close=("[/THINK]",), markers=MISTRAL)
    out, _ = run(b, ["[THINK]", "a", " b", "[/THINK]", "It", " is"])
    assert out == ["[THINK]", "a", "[/THINK]", "It", " is"] and b.used == 1


def test_another_token_drops_the_plan_and_the_next_step_plans_again() -> None:
    """A ban (or a grammar) took another token than the planned one: the count goes on, and the next
    step forces the close again."""
    b = make(1, close=("</", "think", ">"))
    for t in ["<think>", "a"]:
        b.observe(ID[t])
    assert b.forced() == ID["</"]
    b.observe(ID[" c"])               # not the planned token
    assert b.used == 2 and b.forced() == ID["</"]


class _Core(Postprocess):
    def __init__(self) -> None:
        self.eos = {len(VOCAB)}


def _seq(budget: ThinkBudget | None, **kw: object) -> Sequence:
    return Sequence(id="r", prompt_ids=[0], params=SamplingParams(temperature=0, **kw), sink=lambda ev: None,  # type: ignore[arg-type]
                    detok=IncrementalDetokenizer(lambda ids: ""), model="m", think=budget)


def test_the_sampler_takes_the_forced_token_over_the_likeliest() -> None:
    core, b = _Core(), make(1)
    for t in ["<think>", "a"]:
        b.observe(ID[t])
    logits = np.zeros(len(VOCAB) + 1, dtype=np.float32)
    logits[ID[" b"]] = 10.0
    assert core.select(_seq(b), logits) == ID["</think>"]
    assert core.select(_seq(make(5)), logits) == ID[" b"]          # the budget is not spent: the model's choice
    assert core.select(_seq(None), logits) == ID[" b"]


def test_a_banned_close_token_is_not_forced() -> None:
    """logit_bias -100 (or a grammar) rules the close out: the sampler keeps the model's choice."""
    core, b = _Core(), make(0)
    b.observe(ID["<think>"])
    logits = np.zeros(len(VOCAB) + 1, dtype=np.float32)
    logits[ID[" b"]] = 10.0
    assert core.select(_seq(b, logit_bias={ID["</think>"]: -100}), logits) == ID[" b"]


def test_effort_levels_map_to_documented_budgets() -> None:
    assert EFFORT_BUDGETS == {"minimal": 128, "low": 512, "medium": 2048, "high": 8192, "xhigh": None}
    assert effort_budget("low") == 512 and effort_budget(None) is None and effort_budget("max") is None
    with pytest.raises(InvalidRequest) as err:
        SamplingParams(reasoning_budget=-2)
    assert err.value.param == "reasoning_budget"


def _chat(**kw: object) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **kw)  # type: ignore[arg-type]


def test_chat_fields_as_a_budget() -> None:
    assert _chat().reasoning_budget() is None
    assert _chat(reasoning_effort="minimal").reasoning_budget() == 128
    assert _chat(reasoning_effort="xhigh").reasoning_budget() is None
    assert _chat(reasoning_effort="low", thinking_token_budget=7).reasoning_budget() == 7  # the exact one wins
    assert _chat(chat_template_kwargs={"thinking_budget": 9}).reasoning_budget() == 9
    assert _chat(chat_template_kwargs={"thinking_budget": 9}, thinking_token_budget=3).reasoning_budget() == 3
    with pytest.raises(InvalidRequest) as err:
        _chat(chat_template_kwargs={"thinking_budget": -1}).reasoning_budget()
    assert err.value.param == "chat_template_kwargs.thinking_budget"
    with pytest.raises(ValueError):
        _chat(thinking_token_budget=-1)
    assert _chat(chat_template_kwargs={"enable_thinking": True, "thinking_budget": 4}).thinking() is None


def _messages(**kw: object) -> MessagesRequest:
    return MessagesRequest(model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}], **kw)  # type: ignore[arg-type]


class _NoRouter:
    router = None


@pytest.mark.parametrize("thinking,param", [
    ({"type": "enabled"}, "thinking.budget_tokens"),
    ({"type": "enabled", "budget_tokens": -3}, "thinking.budget_tokens"),
    ({"type": "enabled", "budget_tokens": True}, "thinking.budget_tokens"),
    ({"type": "on"}, "thinking.type"),
])
def test_messages_thinking_is_checked(thinking: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        _check(_NoRouter(), _messages(thinking=thinking))  # type: ignore[arg-type]
    assert err.value.param == param


def test_messages_thinking_as_a_budget() -> None:
    on = _messages(thinking={"type": "enabled", "budget_tokens": 1024})
    assert thinking_of(on) is True and budget_of(on) == 1024
    assert budget_of(_messages(thinking={"type": "adaptive"}, output_config={"effort": "low"})) == 512
    assert budget_of(_messages(thinking={"type": "adaptive"}, output_config={"effort": "max"})) is None
    assert thinking_of(_messages()) is False and thinking_of(_messages(thinking={"type": "adaptive"})) is None
    with pytest.raises(InvalidRequest) as err:
        _check(_NoRouter(), _messages(output_config={"effort": "extreme"}))  # type: ignore[arg-type]
    assert err.value.param == "output_config.effort"


def test_ollama_think_levels_as_a_budget() -> None:
    def req(think: object) -> ChatRequest:
        return ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], think=think)  # type: ignore[arg-type]

    assert req("low").reasoning_budget() == 512 and req("high").reasoning_budget() == 8192
    assert req(True).reasoning_budget() is None and req(False).thinking() is False


def test_a_routed_request_refuses_a_budget() -> None:
    """No provider the router reaches can carry it: a 400 naming the field, never dropped."""
    from ortserve.server.routed import check_routable

    with pytest.raises(InvalidRequest) as err:
        check_routable(_chat(model="auto", thinking_token_budget=5))
    assert err.value.param == "thinking_token_budget"
