r"""A thinking model's reasoning, apart from its answer, on every API (engine/reasoning.py).

The test material is a real ONNX model whose weights write a fixed text (tests/scripted.py), with
Qwen3's real chat template and the SmolLM2 tokenizer plus Qwen3's ``<think>`` and ``</think>``
tokens: "<think>Plan.</think>\n\nIt is noon!". With thinking off, Qwen3's template closes an empty
block in the prompt, which ends in "\n\n", and the model goes on from there: "It is noon!". A second
model writes its reasoning and then a Hermes call. Served on 127.0.0.1, read with the openai and
anthropic clients, streamed and not."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest
from openai import BadRequestError, OpenAI
from scripted import build
from servers import ServerThread

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llamacpp import template

THINK = ["<think>", "Plan", ".", "</think>", "\n\n"]
ANSWER = ["It", " is", " noon", "!", "<|im_end|>"]
CALL = ["<", "tool", "_", "call", ">", "\n"]
ASK = [{"role": "user", "content": "What time is it?"}]
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                         "parameters": {"type": "object", "properties": {}}}}


def _model(tmp: Path, tokenizer_dir: Path, chain: list[str]) -> Path:
    return build(tmp, tokenizer_dir, chain, added=("<think>", "</think>"), template=template("Qwen-Qwen3-0.6B"),
                 starts=("\n\n",))


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer_dir: Path) -> Iterator[ServerThread]:
    model = _model(tmp_path_factory.mktemp("thinker"), smollm2_tokenizer_dir, THINK + ANSWER)
    with ServerThread(model, model_id="thinker") as s:
        yield s


@pytest.fixture(scope="module")
def oai(srv: ServerThread) -> OpenAI:
    return OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)


def test_the_model_thinks_in_qwen3_syntax(srv: ServerThread) -> None:
    codec = srv.state.engine.codec
    assert codec.thinks and not codec.answer_starts_thinking() and not codec.answer_starts_thinking(False)
    assert codec.render_chat(ASK, thinking=False).endswith("<think>\n\n</think>\n\n")


@pytest.mark.parametrize("stream", [False, True])
def test_chat_returns_reasoning_content_apart_from_the_answer(oai: OpenAI, stream: bool) -> None:
    kw = {"model": "thinker", "messages": ASK, "max_tokens": 40}
    if stream:
        thought, text, usage = [], [], None
        for chunk in oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):  # type: ignore[call-overload]
            usage = chunk.usage or usage
            for c in chunk.choices:
                thought.append((c.delta.model_extra or {}).get("reasoning_content") or "")
                text.append(c.delta.content or "")
        reasoning, content = "".join(thought), "".join(text)
    else:
        r = oai.chat.completions.create(**kw)  # type: ignore[call-overload]
        reasoning, content, usage = r.choices[0].message.model_extra["reasoning_content"], r.choices[0].message.content, r.usage
    assert reasoning == "Plan." and content == "It is noon!"
    assert usage is not None and 0 < usage.completion_tokens_details.reasoning_tokens < usage.completion_tokens


def test_reasoning_effort_none_turns_thinking_off(oai: OpenAI) -> None:
    r = oai.chat.completions.create(model="thinker", messages=ASK, max_tokens=40,  # type: ignore[arg-type]
                                    reasoning_effort="none")
    msg = r.choices[0].message
    assert msg.content == "It is noon!" and "reasoning_content" not in (msg.model_extra or {})
    assert r.usage is not None and r.usage.completion_tokens_details.reasoning_tokens == 0  # type: ignore[union-attr]


def test_chat_template_kwargs_as_qwen3s_model_card_sends_them(oai: OpenAI) -> None:
    """vLLM's and llama-server's ``chat_template_kwargs``: enable_thinking only, anything else named."""
    r = oai.chat.completions.create(model="thinker", messages=ASK, max_tokens=40,  # type: ignore[arg-type]
                                    extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content == "It is noon!" and "reasoning_content" not in (r.choices[0].message.model_extra or {})
    on = oai.chat.completions.create(model="thinker", messages=ASK, max_tokens=40,  # type: ignore[arg-type]
                                     extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert on.choices[0].message.model_extra["reasoning_content"] == "Plan."  # type: ignore[index]
    for kwargs, param in (({"add_vision_id": True}, "chat_template_kwargs.add_vision_id"),
                          ({"enable_thinking": "no"}, "chat_template_kwargs.enable_thinking")):
        with pytest.raises(BadRequestError) as err:
            oai.chat.completions.create(model="thinker", messages=ASK, max_tokens=4,  # type: ignore[arg-type]
                                        extra_body={"chat_template_kwargs": kwargs})
        assert err.value.body["param"] == param  # type: ignore[index]
    with pytest.raises(BadRequestError) as err:
        oai.chat.completions.create(model="thinker", messages=ASK, max_tokens=4, reasoning_effort="none",  # type: ignore[arg-type]
                                    extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert err.value.body["param"] == "chat_template_kwargs.enable_thinking"  # type: ignore[index]


def test_a_json_answer_has_no_room_for_thinking(oai: OpenAI) -> None:
    """Under a JSON schema the template is rendered with thinking off: the grammar has no room for it."""
    r = oai.chat.completions.create(model="thinker", messages=ASK, max_tokens=40, response_format={  # type: ignore[arg-type]
        "type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "object", "properties": {
            "time": {"const": "noon"}}, "required": ["time"], "additionalProperties": False}}})
    assert json.loads(r.choices[0].message.content or "") == {"time": "noon"}
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})
    off = oai.chat.completions.create(model="thinker", messages=ASK, max_tokens=4, reasoning_effort="none")  # type: ignore[arg-type]
    on = oai.chat.completions.create(model="thinker", messages=ASK, max_tokens=4)  # type: ignore[arg-type]
    assert r.usage and off.usage and on.usage
    assert r.usage.prompt_tokens == off.usage.prompt_tokens > on.usage.prompt_tokens  # the empty block's tokens


def test_responses_return_a_reasoning_item_then_the_message(oai: OpenAI) -> None:
    r = oai.responses.create(model="thinker", input="What time is it?", max_output_tokens=40)
    assert [o.type for o in r.output] == ["reasoning", "message"] and r.output_text == "It is noon!"
    assert r.output[0].content[0].text == "Plan."  # type: ignore[union-attr,index]
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens > 0
    with oai.responses.stream(model="thinker", input="What time is it?", max_output_tokens=40) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    assert [o.type for o in final.output] == ["reasoning", "message"] and final.output_text == "It is noon!"
    off = oai.responses.create(model="thinker", input="What time is it?", max_output_tokens=40,
                               reasoning={"effort": "none"})
    assert [o.type for o in off.output] == ["message"] and off.output_text == "It is noon!"
    # the reasoning item goes back into the conversation with the answer it came with
    again = oai.responses.create(model="thinker", previous_response_id=r.id, input="And now?", max_output_tokens=40)
    assert again.output_text == "It is noon!"


@pytest.mark.parametrize("stream", [False, True])
def test_messages_think_only_when_asked(srv: ServerThread, stream: bool) -> None:
    claude = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0, timeout=120)
    for thinking, kinds in ((None, ["text"]), ({"type": "disabled"}, ["text"]), ({"type": "adaptive"}, ["thinking", "text"])):
        kw = {"model": "thinker", "max_tokens": 40, "messages": ASK, **({"thinking": thinking} if thinking else {})}
        if stream:
            with claude.messages.stream(**kw) as s:  # type: ignore[arg-type]
                m = s.get_final_message()
        else:
            m = claude.messages.create(**kw)  # type: ignore[arg-type]
        assert [b.type for b in m.content] == kinds and m.content[-1].text == "It is noon!"  # type: ignore[union-attr]
        if kinds[0] == "thinking":
            assert m.content[0].thinking == "Plan."  # type: ignore[union-attr]


@pytest.mark.parametrize("marker", ["spelled", "token"])
def test_thinking_then_a_tool_call(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer_dir: Path,
                                   marker: str) -> None:
    """Reasoning is prose before the call (tool_choice auto): it comes back as reasoning, the call as a call.
    ``token``: ``<tool_call>`` and ``</tool_call>`` are added tokens, as in Qwen's vocabulary, and the
    model writes the token (the grammar asks for it and forces the closing one)."""
    if marker == "token":
        model = build(tmp_path_factory.mktemp("thinker-caller-tok"), smollm2_tokenizer_dir,
                      THINK + ["<tool_call>", "\n"], template=template("Qwen-Qwen3-0.6B"), starts=("\n\n",),
                      added=("<think>", "</think>", "<tool_call>", "</tool_call>"))
    else:
        model = _model(tmp_path_factory.mktemp("thinker-caller"), smollm2_tokenizer_dir, THINK + CALL)
    with ServerThread(model, model_id="caller") as s:
        fmt = s.state.engine.codec.tool_format
        assert (dict(fmt.specials).keys() == {"<tool_call>", "</tool_call>"}) == (marker == "token") and fmt.lead_prose
        client = OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="caller", messages=ASK, tools=[TIME], max_tokens=80,  # type: ignore[arg-type]
                                           logprobs=True)
        msg = r.choices[0].message
        written = [t.token for t in r.choices[0].logprobs.content or []]  # type: ignore[union-attr]
        assert ("<tool_call>" in written) == (marker == "token")  # one token, not "<", "tool", "_call", ">"
        assert msg.model_extra["reasoning_content"] == "Plan." and not msg.content  # type: ignore[index]
        assert [c.function.name for c in msg.tool_calls or []] == ["get_time"] and r.choices[0].finish_reason == "tool_calls"
        # the client sends the reasoning back with the call: Qwen3's template writes it after the question
        history = [*ASK, {"role": "assistant", "content": "", "reasoning_content": "Plan.",
                          "tool_calls": [c.model_dump() for c in msg.tool_calls or []]},
                   {"role": "tool", "tool_call_id": (msg.tool_calls or [])[0].id, "content": "noon"}]
        prompt = s.state.engine.codec.render_chat(history)
        assert "<think>\nPlan.\n</think>" in prompt
        done = client.chat.completions.create(model="caller", messages=history, tools=[TIME], max_tokens=80)  # type: ignore[arg-type]
        assert done.choices[0].message.model_extra["reasoning_content"] == "Plan."  # type: ignore[index]


def test_mistral_reasoning_markers_are_special_tokens_the_answer_still_shows(
        tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer_dir: Path) -> None:
    """Ministral 3 Reasoning's real template: ``[THINK]``/``[/THINK]`` are special tokens in its vocabulary
    (here added as such), which the decoder keeps for the split; the history takes reasoning as a
    thinking chunk."""
    model = build(tmp_path_factory.mktemp("ministral"), smollm2_tokenizer_dir,
                  ["[THINK]", "Plan", ".", "[/THINK]", "It", " is", " noon", "!", "<|im_end|>"],
                  special=("[THINK]", "[/THINK]"), template=template("mistralai-Ministral-3-14B-Reasoning-2512"))
    with ServerThread(model, model_id="ministral") as s:
        codec = s.state.engine.codec
        assert codec.reasoning_markers == ("[THINK]", "[/THINK]") and codec.tool_format.name == "mistral_v11"
        client = OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="ministral", messages=ASK, max_tokens=40)  # type: ignore[arg-type]
        msg = r.choices[0].message
        assert msg.model_extra["reasoning_content"] == "Plan." and msg.content == "It is noon!"  # type: ignore[index]
        history = [*ASK, {"role": "assistant", "content": "It is noon!", "reasoning_content": "Plan."},
                   {"role": "user", "content": "Thanks."}]
        assert "[THINK]Plan.[/THINK]It is noon!" in codec.render_chat(history)
        again = client.chat.completions.create(model="ministral", messages=history, max_tokens=40)  # type: ignore[arg-type]
        assert again.choices[0].message.content == "It is noon!"
        # its template has no switch: asking to turn reasoning off is a 400 naming the field, not ignored
        assert not codec.thinking_switch and s.state.engine.codec.thinks
        with pytest.raises(BadRequestError) as err:
            client.chat.completions.create(model="ministral", messages=ASK, max_tokens=4, reasoning_effort="none")  # type: ignore[arg-type]
        assert err.value.body["param"] == "reasoning_effort"  # type: ignore[index]
        claude = anthropic.Anthropic(base_url=s.url, api_key="none", max_retries=0, timeout=120)
        with pytest.raises(anthropic.BadRequestError):
            claude.messages.create(model="ministral", max_tokens=40, messages=ASK,  # type: ignore[arg-type]
                                   thinking={"type": "disabled"})
        m = claude.messages.create(model="ministral", max_tokens=40, messages=ASK)  # type: ignore[arg-type]
        assert [b.type for b in m.content] == ["thinking", "text"]  # it thinks anyway: the reasoning is shown
        # a completion (no chat, no split) shows the markers the model wrote
        done = client.completions.create(model="ministral", prompt=codec.render_chat(ASK), max_tokens=8)
        assert done.choices[0].text.startswith("[THINK]Plan.[/THINK]It")
