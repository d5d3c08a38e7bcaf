"""min_p, typical_p and logit_bias end to end, and per-model sampling defaults: applied when a
request leaves a field unset, named in X-Ortserve-Sampling*, overridden by explicit values."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import openai
import pytest
from servers import ServerThread

MSG = [{"role": "user", "content": "Say something about the sea."}]


@pytest.fixture(scope="module")
def srv(tiny_model: Path):
    # default_temperature 0: a request that leaves temperature unset is greedy, so "defaults applied" shows
    with ServerThread(tiny_model, max_tokens_cap=64, default_temperature=0.0) as s:
        yield s


@pytest.fixture(scope="module")
def model_srv(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """The tiny model with a generation_config.json of its own (a store made before manifests had it)."""
    d = tmp_path_factory.mktemp("tiny-genconfig")
    for f in tiny_model.iterdir():   # copies: ONNX Runtime refuses external data behind a symlink
        shutil.copy(f, d / f.name)
    (d / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.3, "top_k": 7}))
    with ServerThread(d, max_tokens_cap=64) as s:
        yield s


def chat(srv: ServerThread, **fields: object) -> httpx.Response:
    r = httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": MSG, "max_tokens": 6, **fields}, timeout=60)
    assert r.status_code == 200, r.text
    return r


def text(r: httpx.Response) -> str:
    return r.json()["choices"][0]["message"]["content"]


def test_logit_bias_minus_100_bans_the_greedy_token(srv: ServerThread) -> None:
    codec = srv.state.engine.codec
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    first = client.completions.create(model="tiny", prompt="The sea", max_tokens=1, temperature=0).choices[0].text
    (tid,) = codec.encode(first, add_special_tokens=False)
    banned = client.completions.create(model="tiny", prompt="The sea", max_tokens=1, temperature=0,
                                       logit_bias={str(tid): -100}).choices[0].text
    assert banned and banned != first
    # on the chat API too, and a positive bias of 100 forces a token
    forced = chat(srv, temperature=0, max_tokens=3, logit_bias={str(tid): 100})
    assert text(forced) == first * 3
    r = httpx.post(f"{srv.url}/v1/chat", json={"messages": MSG, "max_tokens": 3, "temperature": 1.0,
                                               "seed": 1, "logit_bias": {str(tid): 100}}, timeout=60)
    assert r.json()["content"] == first * 3


def test_new_controls_reach_the_sampler_and_reproduce(srv: ServerThread) -> None:
    kw = {"temperature": 1.5, "seed": 5, "max_tokens": 12}
    a = chat(srv, min_p=0.3, typical_p=0.8, **kw)
    assert text(a) == text(chat(srv, min_p=0.3, typical_p=0.8, **kw))
    assert "min_p=0.3" in a.headers["x-ortserve-sampling"] and "typical_p=0.8" in a.headers["x-ortserve-sampling"]
    # min_p 1 keeps only the top token: whatever the temperature, the answer is the greedy one
    assert text(chat(srv, temperature=2.0, min_p=1.0, top_k=0, seed=9)) == text(chat(srv, temperature=0))
    for bad, param in (({"min_p": 2}, "min_p"), ({"typical_p": 0}, "typical_p"),
                       ({"logit_bias": {"99999999": 5}}, "logit_bias"), ({"logit_bias": {"a": 5}}, "logit_bias")):
        r = httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": MSG, "max_tokens": 4, **bad}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_server_defaults_fill_unset_fields_and_explicit_values_win(srv: ServerThread) -> None:
    unset = chat(srv)
    assert unset.headers["x-ortserve-sampling"] == ("temperature=0, top_p=0.95, top_k=40, min_p=0.05, "
                                                    "typical_p=1, repetition_penalty=1")
    assert "temperature=server" in unset.headers["x-ortserve-sampling-defaults"]
    assert text(unset) == text(chat(srv, temperature=0))   # the default temperature 0 is greedy
    explicit = chat(srv, temperature=1.0, top_p=1.0, top_k=0, min_p=0, typical_p=1, repetition_penalty=1)
    assert explicit.headers["x-ortserve-sampling-defaults"] == "none"
    assert explicit.headers["x-ortserve-sampling"].startswith("temperature=1, top_p=1, top_k=0, min_p=0")
    seeded = httpx.post(f"{srv.url}/v1/chat", json={"messages": MSG, "max_tokens": 4}, timeout=60)
    assert seeded.headers["x-ortserve-sampling-defaults"].startswith("temperature=server, top_p=server")
    with httpx.stream("POST", f"{srv.url}/v1/completions", json={"prompt": "x", "stream": True, "top_k": 3},
                      timeout=60) as r:
        assert "top_k=3" in r.headers["x-ortserve-sampling"]
        assert "top_k" not in r.headers["x-ortserve-sampling-defaults"]


def test_model_defaults_win_over_server_defaults(model_srv: ServerThread) -> None:
    r = chat(model_srv)
    assert "temperature=0.3, top_p=0.95, top_k=7, min_p=0.05" in r.headers["x-ortserve-sampling"]
    assert r.headers["x-ortserve-sampling-defaults"].startswith("temperature=model, top_p=server, top_k=model")
    r = chat(model_srv, temperature=0, top_k=2)
    assert "temperature=0, top_p=0.95, top_k=2" in r.headers["x-ortserve-sampling"]
