"""The real Gemma 3 270M (google/gemma-3-270m, Q4_K_M GGUF from PyPI, tests/conftest.py's
``gemma3_270m``): a base model a user brings, with no chat template (issue 46).

- ``/v1/completions`` is the raw path: greedy text follows llama.cpp's (``llama-completion -m
  gemma-3-270m-q4_k_m.gguf -p "The capital of France is" --temp 0`` continues
  " the capital of the country of France"): teacher-forced, each of llama.cpp's tokens is the
  model's best or within a near tie of it, and over HTTP the text is llama.cpp's up to the first
  near tie (" country" leads " French" by 0.08 there, within the rounding by which speculation's
  verify step and a decode step differ).
- chat routes use the fallback ChatML template, as llama-server does for a file without one,
  and say so: the header ``x-ortserve-chat-template: fallback-chatml`` (streamed or not, seed API
  too); a model with its own template sends no such header.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from servers import ServerThread

from ortserve.engine.runner import ModelSpec, Runner
from ortserve.engine.tokenizer import TEMPLATE_HEADER, TextCodec

MSG = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT, LLAMA_CPP = "The capital of France is", " the capital of the country of France"
NEAR = 0.25   # logits: activation rounding (int8 per block) moves one by up to ~0.2 between compute paths


@pytest.fixture(scope="module")
def srv(gemma3_270m: Path) -> Iterator[ServerThread]:
    with ServerThread(gemma3_270m, model_id="gemma-3-270m") as s:
        yield s


def test_greedy_completion_is_llama_cpps(srv: ServerThread) -> None:
    r = httpx.post(f"{srv.url}/v1/completions", json={"model": "gemma-3-270m", "prompt": PROMPT,
                                                       "max_tokens": 10, "temperature": 0}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"].startswith(" the capital of the"), r.json()
    assert TEMPLATE_HEADER not in r.headers   # raw text: no template at all


def test_llama_cpps_greedy_tokens_are_the_models_best(gemma3_270m: Path) -> None:
    codec = TextCodec(gemma3_270m)
    runner = Runner(ModelSpec.read(gemma3_270m), slots=1)
    logits = runner.prefill(0, codec.encode(PROMPT, add_special_tokens=True))
    for token in codec.encode(LLAMA_CPP, add_special_tokens=False):
        assert logits[token] >= logits.max() - NEAR, codec.decode([token])
        logits = runner.decode(np.array([token]))[0]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 8}),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 8, "stream": True}),
    ("/v1/responses", {"input": "What is the capital of France?", "max_output_tokens": 8, "store": False}),
    ("/v1/messages", {"messages": MSG, "max_tokens": 8}),
    ("/v1/chat", {"messages": MSG, "max_tokens": 8}),
])
def test_chat_names_the_fallback_template(srv: ServerThread, path: str, body: dict) -> None:
    r = httpx.post(f"{srv.url}{path}", json={"model": "gemma-3-270m", **body}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers[TEMPLATE_HEADER] == "fallback-chatml"
    engine = srv.state.engine
    assert engine.codec.template_source == "fallback-chatml"
    ids = engine.codec.chat_ids(MSG)
    assert ids[0] == 2 and engine.codec.decode(ids[1:]).startswith("<|im_start|>user\n")   # BOS, then ChatML


def test_a_model_with_its_template_sends_no_header(tiny_model: Path) -> None:
    with ServerThread(tiny_model) as s:
        r = httpx.post(f"{s.url}/v1/chat/completions", json={"model": "tiny", "messages": MSG, "max_tokens": 2})
        assert r.status_code == 200 and TEMPLATE_HEADER not in r.headers
