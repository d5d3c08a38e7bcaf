"""The request contract: every field is supported, ignored-safe (allow-listed) or refused with a
400 naming it; an unknown field is a 400 naming it. Same on all three generation endpoints."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from servers import ServerThread

from ortserve.server.protocol import OPENAI_IGNORED, OPENAI_REFUSED, TOOL_FIELDS

MSG = [{"role": "user", "content": "Say something about the sea."}]
BODIES = {"/v1/chat/completions": {"messages": MSG, "max_tokens": 2},
          "/v1/completions": {"prompt": "The sea", "max_tokens": 2},
          "/v1/chat": {"messages": MSG, "max_tokens": 2}}


@pytest.fixture(scope="module")
def srv(tiny_model: Path):
    with ServerThread(tiny_model, max_tokens_cap=64) as s:
        yield s


def post(srv: ServerThread, path: str, **fields: object) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json={**BODIES[path], **fields}, timeout=60)


def assert_400(r: httpx.Response, param: str, code: str | None = None) -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and param in err["message"]
    if code:
        assert err["code"] == code
    return err


@pytest.mark.parametrize("path", list(BODIES))
def test_unknown_field_is_a_400_naming_it(srv: ServerThread, path: str) -> None:
    err = assert_400(post(srv, path, unknown_xyz=1), "unknown_xyz", "unknown_parameter")
    assert err["message"] == "Unrecognized request argument supplied: unknown_xyz"


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("field,value", [
    ("functions", [{"name": "f", "parameters": {}}]), ("function_call", "auto"),
    ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tool_choice", "auto"),
    ("parallel_tool_calls", True), ("audio", {"voice": "alloy", "format": "wav"}),
    ("prediction", {"type": "content", "content": "x"}), ("top_logprobs", 2),
    ("repeat_penalty", 1.1), ("mirostat", 2), ("reasoning_effort", "low"),
])
def test_refused_fields_are_a_400_naming_them(srv: ServerThread, path: str, field: str, value: object) -> None:
    if path == "/v1/chat/completions" and (field in TOOL_FIELDS or field in ("top_logprobs", "reasoning_effort")):
        return  # served there (tests/integration/test_tools_api.py, test_reasoning.py, and below)
    err = assert_400(post(srv, path, **{field: value}), field, "unsupported_parameter")
    assert OPENAI_REFUSED[field] in err["message"]
    assert post(srv, path, **{field: None}).status_code == 200  # null is the same as leaving it out


def test_reasoning_effort_on_chat_takes_openais_levels(srv: ServerThread) -> None:
    """A model that does not think answers the same at every level (docs/reasoning.md); an unknown
    level is a 400 naming the field."""
    assert post(srv, "/v1/chat/completions", reasoning_effort="none").status_code == 200
    assert post(srv, "/v1/chat/completions", reasoning_effort="high").status_code == 200
    r = post(srv, "/v1/chat/completions", reasoning_effort="extreme")
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort"


@pytest.mark.parametrize("body,param", [
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"store": True}, "store"),
    ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    # an image for a text-only model (docs/vision.md): the image's own field
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content.0.image_url.url"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
     "messages.0.content"),
    ({"messages": [{"role": "user", "content": "hi", "name": "bob"}]}, "messages.0.name"),
    ({"messages": [MSG[0], {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]},
     "messages.1.tool_calls"),
    ({"messages": [{"role": "user", "content": "hi", "colour": "red"}]}, "messages.0.colour"),
    ({"stream_options": {"include_usage": True, "nope": 1}}, "stream_options.nope"),
])
def test_chat_refuses_values_it_cannot_honour(srv: ServerThread, body: dict, param: str) -> None:
    assert_400(post(srv, "/v1/chat/completions", **body), param)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_allow_listed_fields_are_accepted(srv: ServerThread, path: str) -> None:
    fields = dict.fromkeys(OPENAI_IGNORED, "x")
    fields["stream_options"] = {"include_usage": True, "include_obfuscation": False}
    r = post(srv, path, stream=True, **fields)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")


def test_chat_accepts_what_it_honours_and_what_clients_echo(srv: ServerThread) -> None:
    echoed = {"role": "assistant", "content": "Waves.", "refusal": None, "tool_calls": None,
              "function_call": None, "audio": None, "annotations": []}
    r = post(
        srv, "/v1/chat/completions", messages=[MSG[0], echoed, MSG[0]], store=False, modalities=["text"],
        response_format={"type": "text"}, logprobs=False, metadata={"tag": "v"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "assistant"


def test_completions_best_of(srv: ServerThread) -> None:
    assert post(srv, "/v1/completions", best_of=1).status_code == 200
    assert_400(post(srv, "/v1/completions", best_of=3), "best_of", "unsupported_parameter")


def test_openai_client_sees_the_unknown_field(srv: ServerThread) -> None:
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2, extra_body={"unknown_xyz": 1})
    assert e.value.body["param"] == "unknown_xyz" and e.value.body["code"] == "unknown_parameter"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2,
                                       functions=[{"name": "f"}])  # served, but needs parameters
    assert e.value.body["param"] == "functions.0.parameters"
    ok = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2, user="u-1",
                                        service_tier="auto", store=False)
    assert ok.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("path", list(BODIES))
def test_negative_seed_is_valid_and_reproducible(srv: ServerThread, path: str) -> None:
    def text(seed: int) -> str:
        r = post(srv, path, seed=seed, temperature=1.0, max_tokens=8)
        assert r.status_code == 200, r.text
        j = r.json()
        return j["content"] if path == "/v1/chat" else str(j["choices"][0])
    assert text(-1) == text(-1)
    assert text(-(2**63)) == text(-(2**63))
    assert_400(post(srv, path, seed=2**64), "seed")
    assert_400(post(srv, path, seed=-(2**63) - 1), "seed")


def test_seed_routes_check_stream(srv: ServerThread) -> None:
    assert post(srv, "/v1/chat", stream=False).status_code == 200
    assert_400(post(srv, "/v1/chat", stream=True), "stream")
    r = httpx.post(f"{srv.url}/v1/chat/stream", json={**BODIES["/v1/chat"], "stream": True}, timeout=60)
    assert r.status_code == 200 and '"done": true' in r.text.replace('"done":true', '"done": true')
    r = httpx.post(f"{srv.url}/v1/chat/stream", json={**BODIES["/v1/chat"], "stream": False}, timeout=60)
    assert_400(r, "stream")
