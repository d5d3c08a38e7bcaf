"""Images on Ollama's API (``images``: base64 strings on /api/chat messages and on /api/generate),
driven by the official `ollama` Python client against the random-weight Qwen2.5-VL (tests/conftest.py's
``tiny_vl``, built once a session). The answers are random tokens: the tests check that the image
reached the vision encoder (its run and cache-hit counters), streamed equals whole at temperature 0,
/api/show's ``vision`` capability, and the 400s that name the field in Ollama's error shape."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ollama
import pytest
from servers import ServerThread

MODEL = "tiny-vl"
GREEDY = {"temperature": 0, "num_predict": 4}


def png(width: int = 84, height: int = 56, seed: int = 0) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def srv(tiny_model: Path, tiny_vl: tuple[Path, Path, Any]) -> Iterator[ServerThread]:
    with ServerThread(tiny_model, home=str(tiny_vl[1]), image_max_bytes=100_000, image_max_images=2) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv: ServerThread) -> ollama.Client:
    return ollama.Client(host=srv.url, timeout=120)


def encoder(srv: ServerThread) -> Any:
    holder = srv.state.vision
    return holder.engine(MODEL).encoder


def test_chat_images_reach_the_encoder_streamed_and_whole(srv: ServerThread, client: ollama.Client) -> None:
    ask = [{"role": "user", "content": "What is in the image?", "images": [png(seed=20)]}]
    whole = client.chat(model=MODEL, messages=ask, options=GREEDY)
    assert whole.done and whole.message.content and whole.eval_count >= 1
    enc = encoder(srv)
    runs, hits = enc.runs, enc.hits
    parts = list(client.chat(model=MODEL, messages=ask, options=GREEDY, stream=True))
    assert parts[-1].done and "".join(p.message.content for p in parts) == whole.message.content
    assert (enc.runs, enc.hits) == (runs, hits + 1)   # the same image: its features from the cache
    # another image in a later turn: encoded (both turns' images go to the model)
    again = [*ask, {"role": "assistant", "content": whole.message.content},
             {"role": "user", "content": "And this one?", "images": [png(56, 56, seed=21)]}]
    assert client.chat(model=MODEL, messages=again, options=GREEDY).message.content
    assert (enc.runs, enc.hits) == (runs + 1, hits + 2)


def test_generate_with_images(srv: ServerThread, client: ollama.Client) -> None:
    enc = encoder(srv)
    runs = enc.runs
    out = client.generate(model=MODEL, prompt="Describe the picture.", images=[png(seed=22)], options=GREEDY)
    assert out.done and out.response and enc.runs == runs + 1
    streamed = "".join(p.response for p in client.generate(model=MODEL, prompt="Describe the picture.",
                                                            images=[png(seed=22)], options=GREEDY, stream=True))
    assert streamed == out.response and enc.runs == runs + 1


def test_show_lists_the_vision_capability(client: ollama.Client) -> None:
    assert "vision" in (client.show(MODEL).capabilities or [])
    assert "vision" not in (client.show("tiny").capabilities or [])


def post(srv: ServerThread, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(srv.url + path, json={"stream": False, "options": GREEDY, **body}, timeout=120)


def test_bad_images_are_400s_naming_the_field(srv: ServerThread) -> None:
    user = lambda images, model=MODEL: {"model": model, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"},
        {"role": "user", "content": "and this?", "images": images}]}
    good = base64.b64encode(png(seed=23)).decode()
    cases = [
        ("/api/chat", user(["not base64!"]), "'messages.2.images.0' is not valid base64"),
        ("/api/chat", user([good, base64.b64encode(b"plain text").decode()]), "'messages.2.images.1' is not an image"),
        ("/api/chat", user([base64.b64encode(png(400, 400)).decode()]), "above this server's limit of 100000 bytes"),
        ("/api/chat", user([good, good, good]), "'messages.2.images.2' is the first one past it"),
        ("/api/chat", user([good], model="tiny"), "'messages.2.images.0' is an image, and the model 'tiny' reads text only"),
        ("/api/generate", {"model": MODEL, "prompt": "p", "images": ["%%%"]}, "'images.0' is not valid base64"),
        ("/api/generate", {"model": "tiny", "prompt": "p", "images": [good]}, "'images.0' is an image"),
        ("/api/generate", {"model": MODEL, "prompt": "p", "raw": True, "images": [good]}, "'images' do not apply"),
        ("/api/generate", {"model": MODEL, "prompt": "p", "images": [7]}, "images.0"),
        ("/api/chat", {**user([good]), "options": {**GREEDY, "num_ctx": 512}}, "'options.num_ctx' is not served"),
    ]
    for path, body, says in cases:
        r = post(srv, path, body)
        assert r.status_code == 400 and says in r.json()["error"], (path, r.status_code, r.text)
        ok = post(srv, "/api/generate", {"model": MODEL, "prompt": "p", "images": [good]})   # still serving
        assert ok.status_code == 200 and ok.json()["done"], ok.text
