"""Ollama's API (server/api/ollama*.py) driven by the official `ollama` Python client against a live
server on the real default model: chat, generate, streaming, tools, format, embed, list, show, ps,
version, create/copy/delete, keep_alive, and bad input in Ollama's error shape. One server for the module."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import ollama
import pytest
from ollama import ChatResponse
from servers import ServerThread

pytestmark = pytest.mark.default_model

NAME = "smollm2"
GREEDY = {"temperature": 0, "num_predict": 24}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def srv(default_model: Path, embedding_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    home = tmp_path_factory.mktemp("ollama-home")
    # the session's embedding model, copied in (an empty store would export it with torch first)
    for variant in embedding_model.parent.glob(embedding_model.name.split("--")[0] + "--*"):
        shutil.copytree(variant, home / "models" / variant.name)
    with ServerThread(default_model, model_id=NAME, home=home) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv: ServerThread) -> ollama.Client:
    return ollama.Client(host=srv.url, timeout=120)


def test_chat_and_generate(client: ollama.Client) -> None:
    r = client.chat(model=NAME, messages=[{"role": "user", "content": "Say hello."}], options=GREEDY)
    assert r.done and r.done_reason in ("stop", "length") and r.message.role == "assistant"
    assert r.message.content.strip()
    assert r.prompt_eval_count > 0 and 0 < r.eval_count <= 24 and r.total_duration > 0
    g = client.generate(model=NAME, prompt="Say hello.", system="Be brief.", options=GREEDY)
    assert g.done and g.response.strip() and 0 < g.eval_count <= 24
    # num_predict bounds the answer; stop ends it at the string, which is not returned
    short = client.generate(model=NAME, prompt="Count from 1 to 20.", options={"temperature": 0, "num_predict": 3})
    assert short.eval_count == 3 and short.done_reason == "length"


def test_streamed_chat(client: ollama.Client) -> None:
    parts = list(client.chat(model=NAME, messages=[{"role": "user", "content": "Name a color."}], options=GREEDY,
                             stream=True))
    assert len(parts) > 2 and all(not p.done for p in parts[:-1]) and parts[-1].done
    assert parts[-1].message.content == "" and parts[-1].done_reason in ("stop", "length")
    text = "".join(p.message.content for p in parts)
    assert text.strip() and parts[-1].eval_count <= 24 and parts[-1].prompt_eval_count > 0
    gen = list(client.generate(model=NAME, prompt="Name a color.", options=GREEDY, stream=True))
    assert gen[-1].done and "".join(p.response for p in gen).strip()


def test_raw_prompt_skips_the_chat_template(client: ollama.Client) -> None:
    templated = client.generate(model=NAME, prompt="Hi", options={"num_predict": 1})
    raw = client.generate(model=NAME, prompt="<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", raw=True,
                          options={"num_predict": 8, "temperature": 0})
    # the template adds SmolLM2's default system prompt; the raw prompt is its own tokens only
    assert raw.response.strip() and raw.prompt_eval_count < templated.prompt_eval_count
    with pytest.raises(ollama.ResponseError) as e:  # SmolLM2 has no FIM tokens
        client.generate(model=NAME, prompt="def add(a, b):\n", suffix="\n    return c\n", options={"num_predict": 4})
    assert e.value.status_code == 400 and "'suffix'" in e.value.error and "FIM tokens" in e.value.error
    assert "insert" not in client.show(NAME).capabilities


def _chat_raw(client: ollama.Client, stream: bool, **body: object) -> list[ChatResponse]:
    """The client's own request and response parsing, with ortserve's tool_choice extension in the body."""
    out = client._request(ChatResponse, "POST", "/api/chat", json={"model": NAME, "stream": stream, **body},
                          stream=stream)
    return list(out) if stream else [out]  # type: ignore[list-item]


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_in_ollamas_shape(client: ollama.Client, stream: bool) -> None:
    parts = _chat_raw(client, stream, messages=ASK, tools=[WEATHER], tool_choice="required",
                      options={"temperature": 0, "num_predict": 48})
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert len(calls) >= 1 and parts[-1].done and parts[-1].done_reason == "stop"
    call = calls[0]
    assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    jsonschema.validate(dict(call.function.arguments), WEATHER["function"]["parameters"])
    # the result goes back as Ollama sends it (assistant tool_calls, then a tool message): a text answer
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [{"function": {
        "name": "get_weather", "arguments": dict(call.function.arguments)}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 21 C"}]
    answer = client.chat(model=NAME, messages=history, tools=[WEATHER], options=GREEDY)
    assert answer.message.content.strip() and not answer.message.tool_calls


def test_format_json_and_schema(client: ollama.Client) -> None:
    r = client.generate(model=NAME, prompt="Describe a cat as JSON.", format="json",
                        options={"temperature": 0, "num_predict": 64})
    assert isinstance(json.loads(r.response), dict)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    c = client.chat(model=NAME, messages=[{"role": "user", "content": "Invent a person."}], format=schema,
                    options={"temperature": 0, "num_predict": 64})
    jsonschema.validate(json.loads(c.message.content), schema)


def test_embed_and_legacy_embeddings(client: ollama.Client) -> None:
    r = client.embed(model="all-minilm-l6-v2", input=["a cat sat on the mat", "stock markets fell"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 384 and r.prompt_eval_count > 0
    one = client.embeddings(model="all-minilm-l6-v2", prompt="a cat sat on the mat")
    assert one.embedding == pytest.approx(r.embeddings[0], abs=1e-5)
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="all-minilm-l6-v2", input="x", dimensions=100)
    assert e.value.status_code == 400 and "dimensions" in e.value.error


def test_list_show_ps_version(client: ollama.Client, srv: ServerThread) -> None:
    names = [m.model for m in client.list().models]
    assert names[0] == NAME and any(n.startswith("all-minilm-l6-v2:") for n in names)
    info = client.show(NAME)
    assert "<|im_start|>" in info.template and info.capabilities[:2] == ["completion", "tools"]
    assert info.modelinfo["llama.context_length"] == srv.state.engine.context_length
    assert info.details.family == "llama" and info.details.format == "onnx"
    emb = client.show("all-minilm-l6-v2")
    assert emb.capabilities == ["embedding"]
    loaded = {m.model: m for m in client.ps().models}
    assert loaded[NAME].context_length == srv.state.engine.context_length and loaded[NAME].size > 0
    # Ollama reads the body as JSON whatever its content type (its docs' `curl -d` sends a form one)
    r = httpx.post(f"{srv.url}/api/show", content=json.dumps({"model": NAME}),
                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.json()["capabilities"][0] == "completion"
    verbose = httpx.post(f"{srv.url}/api/show", json={"model": NAME, "verbose": True}).json()["model_info"]
    tokens = verbose["tokenizer.ggml.tokens"]
    codec = srv.state.engine.codec
    assert len(tokens) == codec.tokenizer.get_vocab_size() and tokens[codec.token_id("<|im_start|>")] == "<|im_start|>"
    version = httpx.get(f"{srv.url}/api/version").json()
    assert version["version"].count(".") == 2 and version["ortserve"]


def test_create_copy_keep_alive_delete(client: ollama.Client, tiny_model: Path) -> None:
    done = client.create(model="tiny-created", from_=str(tiny_model))
    assert done.status == "success"
    assert any(m.model.startswith("tiny-created:") for m in client.list().models)
    assert client.copy("tiny-created", "tiny-copy").status == "success"
    assert "tiny-copy" in [m.model for m in client.list().models]
    r = client.generate(model="tiny-copy", prompt="hi", keep_alive="10m", options={"num_predict": 2})
    assert r.done and r.eval_count == 2
    row = next(m for m in client.ps().models if m.model.startswith("tiny-created"))
    assert row.expires_at is not None and row.expires_at.year < 9999
    unloaded = client.generate(model="tiny-copy", prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert not any(m.model.startswith("tiny-created") for m in client.ps().models)
    assert client.delete("tiny-copy").status == "success"
    assert "tiny-copy" not in [m.model for m in client.list().models]
    with pytest.raises(ollama.ResponseError) as e:
        client.show("tiny-copy")
    assert e.value.status_code == 404
    assert client.delete("tiny-created").status == "success"
    assert not any(m.model.startswith("tiny-created") for m in client.list().models)
    # pull of a local path: the import's progress as NDJSON lines, then success; again: already there
    statuses = [p.status for p in client.pull(str(tiny_model), stream=True)]
    assert statuses[-1] == "success" and any("measuring" in st for st in statuses[:-1])
    assert client.pull("model").status == "success"  # the id comes from the directory's name
    assert client.delete("model").status == "success"
    loaded = client.chat(model=NAME, messages=[])  # an empty chat loads the model
    assert loaded.done_reason == "load"


def test_bad_input_in_ollamas_error_shape(client: ollama.Client, srv: ServerThread) -> None:
    def status(**kw: object) -> tuple[int, str]:
        with pytest.raises(ollama.ResponseError) as e:
            client.chat(**{"model": NAME, "messages": ASK, **kw})  # type: ignore[arg-type]
        return e.value.status_code, e.value.error

    code, msg = status(options={"num_predict": 4, "bogus_option": 1})
    assert code == 400 and "options.bogus_option" in msg
    code, msg = status(options={"mirostat": 2})
    assert code == 400 and "options.mirostat" in msg and "mirostat" in msg
    assert status(model="no-such-model")[0] == 404
    code, msg = status(think=True)  # SmolLM2 does not reason
    assert code == 400 and "thinking" in msg
    code, msg = status(options={"num_ctx": 10})
    assert code == 400 and "num_ctx" in msg
    body = httpx.post(f"{srv.url}/api/generate", json={"model": NAME, "prompt": "hi", "raw": True, "system": "x"})
    assert body.status_code == 400 and list(body.json()) == ["error"] and "'system'" in body.json()["error"]
    body = httpx.post(f"{srv.url}/api/generate", json={"model": NAME, "prompt": "hi", "template": "{{ .Prompt }}"})
    assert body.status_code == 400 and "'template'" in body.json()["error"]
    with pytest.raises(ollama.ResponseError) as e:  # a registry name: a 404 at once, never a download or a hang
        client.pull("llama3.2")
    assert e.value.status_code == 404 and "registry" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.create(model="x", from_="/no/such/file.gguf")
    assert e.value.status_code == 404


def test_api_key_guards_the_ollama_routes(tiny_model: Path, tmp_path: Path) -> None:
    with ServerThread(tiny_model, home=tmp_path, api_key="sekret") as s:
        with pytest.raises(ollama.ResponseError) as e:
            ollama.Client(host=s.url).list()
        assert e.value.status_code == 401 and "API key" in e.value.error
        names = [m.model for m in ollama.Client(host=s.url, headers={"Authorization": "Bearer sekret"}).list().models]
        assert names == ["tiny"]
