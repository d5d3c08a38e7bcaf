"""Llama 3's own tool syntax end to end: a tiny random-weight Llama whose tokenizer is Llama 3's real
one (llama.cpp's llama-bpe vocab, 128,256 tokens; hidden size 64, one layer, keeps it cheap) and whose template is
Llama 3.2's real one, built to ONNX, served on 127.0.0.1 and driven by the openai client:
``tool_choice: required`` gives parsed ``tool_calls``, and the tokens the model wrote (logprobs) are
Llama 3's bare ``{"name": ..., "parameters": ...}``, not Hermes' ``<tool_call>``."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from llamacpp import template
from servers import ServerThread
from vocab_tokenizers import tokenizer_dir

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
ASK = [{"role": "system", "content": "You answer with tools."},
       {"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def llama3_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ortserve.models.convert import build_onnx, make_tiny_llama

    hf = make_tiny_llama(tmp_path_factory.mktemp("llama3-hf") / "hf", tokenizer_dir("llama-bpe"), layers=1, hidden=64)
    out = build_onnx(hf, tmp_path_factory.mktemp("llama3-onnx") / "model", precision="fp32")
    (out / "chat_template.jinja").write_text(template("meta-llama-Llama-3.2-3B-Instruct"), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def server(llama3_model: Path) -> Iterator[ServerThread]:
    with ServerThread(llama3_model, model_id="tiny-llama3") as srv:
        yield srv


def test_llama3_model_calls_tools_in_its_own_syntax(server: ServerThread) -> None:
    assert server.state.engine.codec.tool_format.name == "llama3_json"
    client = OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
    r = client.chat.completions.create(model="tiny-llama3", messages=ASK, tools=[WEATHER],  # type: ignore[arg-type]
                                       tool_choice="required", max_tokens=80, logprobs=True, seed=3)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and set(args) == {"city", "unit"}
    written = "".join(t.token for t in choice.logprobs.content)  # type: ignore[union-attr]
    assert written.startswith('{"name": "get_weather", "parameters": {') and "<tool_call>" not in written

    # streamed: the same kind of call, its arguments in pieces
    stream = client.chat.completions.create(model="tiny-llama3", messages=ASK, tools=[WEATHER],  # type: ignore[arg-type]
                                            tool_choice="required", max_tokens=80, stream=True, seed=3)
    names, pieces, finish = [], [], None
    for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or []:
            if tc.function and tc.function.name:
                names.append(tc.function.name)
            if tc.function and tc.function.arguments:
                pieces.append(tc.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    assert names and names[0] == "get_weather" and finish == "tool_calls"
    assert "".join(pieces).startswith(call.function.arguments)  # same seed, same first call

    # the result goes back through Llama 3's template (ipython turn) and the model answers
    turn = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'}]
    again = client.chat.completions.create(model="tiny-llama3", messages=turn, tools=[WEATHER],  # type: ignore[arg-type]
                                           tool_choice="none", max_tokens=8)
    assert again.choices[0].finish_reason in ("stop", "length") and again.usage.prompt_tokens > 0  # type: ignore[union-attr]


def test_llama3_model_through_anthropic_messages_and_responses(server: ServerThread) -> None:
    """The same syntax under the other wire APIs (they share server/conversation.py)."""
    import anthropic

    claude = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)
    fn = WEATHER["function"]
    # one call, greedy: a random model's list of parallel calls can outgrow max_tokens (docs/tools.md)
    msg = claude.messages.create(model="tiny-llama3", max_tokens=80, messages=[ASK[1]],  # type: ignore[list-item]
                                 tools=[{"name": fn["name"], "description": fn["description"],
                                         "input_schema": fn["parameters"]}], extra_body={"temperature": 0},
                                 tool_choice={"type": "any", "disable_parallel_tool_use": True})
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and uses and uses[0].name == "get_weather"
    assert set(uses[0].input) == {"city", "unit"}  # type: ignore[arg-type]

    client = OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
    r = client.responses.create(model="tiny-llama3", input="Weather in Paris?", max_output_tokens=80,
                                tools=[{"type": "function", **fn}], tool_choice="required",  # type: ignore[list-item]
                                parallel_tool_calls=False, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and set(json.loads(calls[0].arguments)) == {"city", "unit"}
