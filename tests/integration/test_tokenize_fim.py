"""Tokenize, detokenize and token counts on the real default model, and fill-in-the-middle on a
code model with real FIM tokens: a tiny random-weight Llama whose tokenizer is StarCoder2's real one
(llama.cpp's starcoder vocab: ``<fim_prefix>``, ``<fim_suffix>``, ``<fim_middle>``, ``<repo_name>``,
``<file_sep>``), served on 127.0.0.1. The FIM tests assert the exact token ids the server submits
(the engine's own queue, read as it takes the sequence) and that a real generation answers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from openai import BadRequestError, OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from servers import ServerThread
from vocab_tokenizers import tokenizer_dir

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
SYSTEM, ASK = "You are terse.", "What is the weather in Paris?"


@pytest.fixture(scope="module")
def smol(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(default_model, model_id="smollm2", home=tmp_path_factory.mktemp("home")) as s:
        yield s


@pytest.fixture(scope="module")
def coder_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ortserve.models.convert import build_onnx, make_tiny_llama

    hf = make_tiny_llama(tmp_path_factory.mktemp("coder-hf") / "hf", tokenizer_dir("starcoder"), layers=1, hidden=64)
    return build_onnx(hf, tmp_path_factory.mktemp("coder-onnx") / "model", precision="fp32")


@pytest.fixture(scope="module")
def coder(coder_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(coder_model, model_id="tiny-coder", home=tmp_path_factory.mktemp("home")) as s:
        yield s


def _submitted(srv: ServerThread, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The prompt ids of every sequence the engine's core takes from now on (the real core runs them)."""
    seen: list[list[int]] = []
    core = srv.state.engine.core
    add = core.add

    def record(seq: Any) -> Any:
        seen.append(list(seq.prompt_ids))
        return add(seq)

    monkeypatch.setattr(core, "add", record)
    return seen


def test_tokenize_and_detokenize_in_llama_servers_shape(smol: ServerThread) -> None:
    codec = smol.state.engine.codec
    text = "Hello world<|im_end|>"
    r = httpx.post(f"{smol.url}/tokenize", json={"content": text})
    assert r.status_code == 200
    ids = r.json()["tokens"]
    assert ids == codec.tokenizer.encode(text, add_special_tokens=False).ids and ids[-1] == codec.token_id("<|im_end|>")
    pieces = httpx.post(f"{smol.url}/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids and "".join(p["piece"] for p in pieces) == text
    # parse_special false: the special token's text is tokenized as text
    plain = httpx.post(f"{smol.url}/tokenize", json={"content": text, "parse_special": False}).json()["tokens"]
    assert codec.token_id("<|im_end|>") not in plain and len(plain) > len(ids)
    back = httpx.post(f"{smol.url}/detokenize", json={"tokens": ids})
    assert back.json() == {"content": text}
    assert httpx.post(f"{smol.url}/detokenize", json={"tokens": plain}).json()["content"] == text
    # a model that is not served, a token outside the vocabulary, a body with neither form: 4xx naming the field
    bad = httpx.post(f"{smol.url}/detokenize", json={"tokens": [0, 10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens.1"
    neither = httpx.post(f"{smol.url}/tokenize", json={"add_special": True})
    assert neither.status_code == 400 and neither.json()["error"]["param"] == "content"
    wrong = httpx.post(f"{smol.url}/tokenize", json={"content": "x", "with_pieces": "yes"})
    assert wrong.status_code == 400 and "with_pieces" in wrong.json()["error"]["param"]


def test_every_count_agrees_on_one_conversation(smol: ServerThread) -> None:
    oai = OpenAI(base_url=f"{smol.url}/v1", api_key="none", max_retries=0, timeout=120)
    ant = anthropic.Anthropic(base_url=smol.url, api_key="none", max_retries=0, timeout=120)
    # without tools: /tokenize's messages, Responses' input_tokens, Messages' count_tokens, and the usage
    tok = httpx.post(f"{smol.url}/tokenize", json={"model": "smollm2", "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}]}).json()["count"]
    counted = oai.responses.input_tokens.count(model="smollm2", instructions=SYSTEM, input=ASK)
    assert counted.object == "response.input_tokens"
    ant_count = ant.messages.count_tokens(model="smollm2", system=SYSTEM, messages=[{"role": "user", "content": ASK}])
    used = oai.responses.create(model="smollm2", instructions=SYSTEM, input=ASK, max_output_tokens=4, store=False)
    assert tok == counted.input_tokens == ant_count.input_tokens == used.usage.input_tokens  # type: ignore[union-attr]
    # with a tool: the same rendered prompt (tools in the template) through both APIs
    counted_t = oai.responses.input_tokens.count(model="smollm2", instructions=SYSTEM, input=ASK,
                                                 tools=[WEATHER])  # type: ignore[list-item]
    ant_t = ant.messages.count_tokens(model="smollm2", system=SYSTEM, messages=[{"role": "user", "content": ASK}],
                                      tools=[{"name": "get_weather", "description": WEATHER["description"],
                                              "input_schema": WEATHER["parameters"]}])  # type: ignore[list-item]
    used_t = ant.messages.create(model="smollm2", system=SYSTEM, max_tokens=4, messages=[{"role": "user", "content": ASK}],
                                 tools=[{"name": "get_weather", "description": WEATHER["description"],
                                         "input_schema": WEATHER["parameters"]}])  # type: ignore[list-item]
    # Anthropic's usage counts the prompt tokens read from the cache apart
    prompt_t = used_t.usage.input_tokens + (used_t.usage.cache_read_input_tokens or 0)
    assert counted_t.input_tokens == ant_t.input_tokens == prompt_t > tok


def test_fim_needs_fim_tokens(smol: ServerThread) -> None:
    oai = OpenAI(base_url=f"{smol.url}/v1", api_key="none", max_retries=0, timeout=120)
    with pytest.raises(BadRequestError) as err:
        oai.completions.create(model="smollm2", prompt="def add(a, b):\n", suffix="\n    return c\n", max_tokens=4)
    assert err.value.body["param"] == "suffix" and "FIM tokens" in err.value.body["message"]  # type: ignore[index]
    r = httpx.post(f"{smol.url}/infill", json={"input_prefix": "def f(", "input_suffix": ")"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_suffix"
    # an empty suffix at the end of a file is a plain completion there
    assert oai.completions.create(model="smollm2", prompt="1, 2, 3,", suffix="", max_tokens=2).choices[0].text


def test_suffix_on_completions_builds_the_fim_prompt(coder: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    codec = coder.state.engine.codec
    assert codec.fim is not None and codec.fim.shape == "starcoder"
    pre, suf, mid = (codec.token_id(t) for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))
    seen = _submitted(coder, monkeypatch)
    oai = OpenAI(base_url=f"{coder.url}/v1", api_key="none", max_retries=0, timeout=120)
    prefix, suffix = "def add(a, b):\n    c = ", "\n    return c  # not <fim_middle> here\n"
    r = oai.completions.create(model="tiny-coder", prompt=prefix, suffix=suffix, max_tokens=6, temperature=0)

    def enc(t: str) -> list[int]:
        return list(codec.tokenizer.encode(t, add_special_tokens=False).ids)

    assert seen == [[pre, *enc(prefix), suf, *codec.text_ids(suffix), mid]]
    # the <fim_middle> typed in the code stays text: only the server's own marker is the token
    assert mid in enc(suffix) and mid not in codec.text_ids(suffix)
    assert codec.decode(codec.text_ids(suffix)) == suffix
    assert r.usage is not None and r.usage.prompt_tokens == len(seen[0])
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1


def test_infill_in_llama_servers_shape(coder: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    codec = coder.state.engine.codec
    ids = {t: codec.token_id(t) for t in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>", "<file_sep>")}
    seen = _submitted(coder, monkeypatch)
    body = {"input_prefix": "import utils\nx = ", "input_suffix": "\nprint(x)\n", "prompt": "utils.",
            "input_extra": [{"filename": "utils.py", "text": "def two():\n    return 2\n"}], "n_predict": 5}
    r = httpx.post(f"{coder.url}/infill", json=body)
    assert r.status_code == 200, r.text
    enc = codec.text_ids
    assert seen == [[ids["<repo_name>"], *enc("myproject\n"),
                     ids["<file_sep>"], *enc("utils.py\n"), *enc("def two():\n    return 2\n"),
                     ids["<file_sep>"], *enc("filename\n"),
                     ids["<fim_prefix>"], *enc("import utils\nx = "), *enc("utils."),
                     ids["<fim_suffix>"], *enc("\nprint(x)\n"), ids["<fim_middle>"]]]
    out = r.json()
    assert out["stop"] is True and out["tokens_evaluated"] == len(seen[0]) and 1 <= out["tokens_predicted"] <= 5
    assert out["stop_type"] in ("eos", "limit") and isinstance(out["content"], str)
    # streamed: data lines of content, the last one with stop true and the same counts
    with httpx.stream("POST", f"{coder.url}/infill", json={**body, "stream": True, "temperature": 0}) as s:
        lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
    import json

    events = [json.loads(ln[6:]) for ln in lines]
    assert events[-1]["stop"] is True and all(e["stop"] is False for e in events[:-1])
    assert events[-1]["tokens_evaluated"] == len(seen[0])
    # bad bodies: 400s naming the field
    for bad, field in [({"input_prefix": "x"}, "input_suffix"), ({**body, "input_extra": [{"filename": "a"}]},
                                                                  "input_extra.0.text"),
                       ({**body, "t_max_predict_ms": 500}, "t_max_predict_ms")]:
        e = httpx.post(f"{coder.url}/infill", json=bad)
        assert e.status_code == 400 and e.json()["error"]["param"] == field, e.text


def test_fim_ids_the_model_declares_win(coder_model: Path, tmp_path: Path) -> None:
    """A GGUF's tokenizer.ggml.fim_*_token_id keys, kept at import as tokenizer_config.json's
    fim_token_ids (models/gguf_vocab.keep_fim_ids), are the ones used."""
    import json
    import shutil

    from ortserve.engine.tokenizer import TextCodec

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(coder_model / name, tmp_path / name)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**cfg, "fim_token_ids": {
        "pre": 7, "suf": 8, "mid": 9, "rep": 5}}), encoding="utf-8")
    fim = TextCodec(tmp_path).fim
    assert fim is not None and (fim.shape, fim.prefix, fim.suffix, fim.middle, fim.repo, fim.file_sep) == (
        "gguf", 7, 8, 9, 5, None)
