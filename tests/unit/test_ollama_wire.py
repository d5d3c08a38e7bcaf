"""Ollama's request bodies as the internal ones (server/api/ollama_wire.py): no model needed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ortserve.errors import InvalidRequest
from ortserve.server.api.ollama_wire import ChatRequest, CreateRequest, GenerateRequest, Options, model_ref


def test_options_become_the_sampling_fields() -> None:
    o = Options(temperature=0.2, top_k=5, repeat_penalty=1.3, stop=["\n"], seed=7, repeat_last_n=-1)
    s = o.sampling()
    assert s["repetition_penalty"] == 1.3 and s["top_k"] == 5 and s["stop"] == ["\n"] and s["seed"] == 7
    assert "repeat_penalty" not in s


@pytest.mark.parametrize("key", ["mirostat", "tfs_z", "num_gpu", "num_thread", "num_keep"])
def test_options_without_an_equivalent_are_refused_by_name(key: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        Options.model_validate({key: 1})
    assert e.value.param == f"options.{key}" and "not supported" in e.value.message


def test_unknown_option_and_a_window_other_than_the_whole_context_are_errors() -> None:
    with pytest.raises(ValidationError) as e:
        Options.model_validate({"bogus": 1})
    assert e.value.errors()[0]["loc"] == ("bogus",) and e.value.errors()[0]["type"] == "extra_forbidden"
    with pytest.raises(ValidationError):
        Options(repeat_last_n=64)


def test_num_predict_unset_or_negative_is_the_cap() -> None:
    assert ChatRequest(model="m").max_tokens(4096) == 4096
    assert ChatRequest(model="m", options={"num_predict": -1}).max_tokens(4096) == 4096
    assert ChatRequest(model="m", options={"num_predict": -2}).max_tokens(4096) == 4096
    assert ChatRequest(model="m", options={"num_predict": 12}).max_tokens(4096) == 12


def test_format_and_think() -> None:
    assert ChatRequest(model="m", format="json").response_format() == {"type": "json_object"}
    schema = {"type": "object"}
    assert ChatRequest(model="m", format=schema).response_format()["json_schema"]["schema"] == schema
    assert ChatRequest(model="m", format="").response_format() is None
    with pytest.raises(ValidationError):
        ChatRequest(model="m", format="yaml")
    assert ChatRequest(model="m", think=False).thinking() is False
    assert ChatRequest(model="m", think="high").thinking() is None


def test_tool_results_answer_the_call_their_tool_name_names() -> None:
    body = ChatRequest(model="m", messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": {"x": 1}}}]},
        {"role": "tool", "tool_name": "b", "content": "B"}, {"role": "tool", "content": "A"}])
    msgs = body.plain_messages()
    calls = {c["function"]["name"]: c["id"] for c in msgs[1]["tool_calls"]}
    assert msgs[1]["tool_calls"][1]["function"]["arguments"] == '{"x": 1}'
    assert msgs[2]["tool_call_id"] == calls["b"] and msgs[3]["tool_call_id"] == calls["a"]


def test_generate_raw_and_refusals() -> None:
    assert GenerateRequest(model="m", prompt="p").prompt_ids() is None
    assert GenerateRequest(model="m", prompt="p", raw=True).prompt_ids() is not None
    with pytest.raises(InvalidRequest) as e:
        GenerateRequest(model="m", prompt="p", raw=True, system="s")
    assert e.value.param == "system"
    with pytest.raises(InvalidRequest) as e:
        GenerateRequest.model_validate({"model": "m", "template": "{{ .Prompt }}"})
    assert e.value.param == "template"
    # images (base64) become image parts naming their field; server/vision.py reads and checks them
    msg = ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x",
                                                                  "images": ["aGk=", "data:image/png;base64,aGk="]}]})
    assert msg.plain_messages()[0]["content"] == [
        {"type": "image_url", "url": "data:image/*;base64,aGk=", "param": "messages.0.images.0"},
        {"type": "image_url", "url": "data:image/png;base64,aGk=", "param": "messages.0.images.1"},
        {"type": "text", "text": "x"}]
    gen = GenerateRequest(model="m", prompt="p", images=["aGk="]).plain_messages()
    assert gen[0]["content"][0]["param"] == "images.0"
    with pytest.raises(InvalidRequest) as e:
        GenerateRequest(model="m", prompt="p", raw=True, images=["aGk="])
    assert e.value.param == "images"
    with pytest.raises(ValidationError):
        ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x", "images": [1]}]})
    with pytest.raises(InvalidRequest) as e:
        CreateRequest.model_validate({"model": "x", "from": "/m.gguf", "quantize": "q4_K_M"})
    assert e.value.param == "quantize"
    assert CreateRequest.model_validate({"model": "x", "from": "/m.gguf"}).from_ == "/m.gguf"
    assert model_ref("llama3:latest") == "llama3" and model_ref("m:q4_1-cpu") == "m:q4_1-cpu"
